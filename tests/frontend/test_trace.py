"""trace(): meta tracing of big models, no weight copies, shapes vs a real run, fallbacks, errors."""

import pytest
import torch
import torch.fx as fx
import torch.nn as nn

import autopar
from autopar import TraceError
from autopar.cli import main as cli_main


def test_48_layer_gpt_traces_on_meta_without_weights():
    model, inputs = autopar.zoo.get("gpt", layers=48, width=1024, heads=16, device="meta")
    graph = autopar.trace(model, inputs)
    assert all(p.is_meta for p in model.parameters())
    assert sum(n.op == "sdpa" for n in graph.nodes) == 48
    assert sum(n.op == "linear" for n in graph.nodes) == 48 * 4 + 1
    assert graph.param_count == sum(p.numel() for p in model.parameters())


def test_real_model_is_neither_copied_nor_run():
    model, inputs = autopar.zoo.get("cnn")
    before = {k: (v.data_ptr(), v.clone()) for k, v in model.state_dict().items()}
    graph = autopar.trace(model, inputs)
    for k, v in model.state_dict().items():  # same storage, same values: BN stats untouched
        assert v.data_ptr() == before[k][0]
        torch.testing.assert_close(v, before[k][1])
    assert graph.fx_graph.get_submodule("stem").weight is model.stem.weight


@pytest.mark.parametrize("name,sizes", [("mlp", {}), ("cnn", {}), ("gpt", {"attention": "manual", "layers": 1}),
                                        ("rnnlm", {"batch": 2, "seq": 5, "vocab": 50, "units": 16, "layers": 2})])
def test_shapes_match_a_real_run_of_the_traced_graph(name, sizes):
    model, inputs = autopar.zoo.get(name, **sizes)
    graph = autopar.trace(model, inputs)
    real: dict[str, object] = {}

    class Record(fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            real[n.name] = out
            return out

    with torch.no_grad():
        Record(graph.fx_graph).run(*inputs)
    for node in graph.nodes:
        value = real[node.name]
        flat = [value] if isinstance(value, torch.Tensor) else [t for t in _flatten(value)]
        assert [tuple(t.shape) for t in flat] == [o.shape for o in node.outputs], node.name
        assert [str(t.dtype)[6:] for t in flat] == [o.dtype for o in node.outputs], node.name


def _flatten(v):
    for x in v:
        if isinstance(x, torch.Tensor):
            yield x
        else:
            yield from _flatten(x)


def test_graph_structure_of_gpt():
    model, inputs = autopar.zoo.get("gpt", layers=2)
    graph = autopar.trace(model, inputs)
    assert graph.fx_graph.meta.get("autopar_frontend", "fx") == "fx"
    fx_names = {n.name for n in graph.fx_graph.graph.nodes}
    assert all(n.name in fx_names for n in graph.nodes)
    assert list(graph.inputs) == ["idx", "labels"] and graph.inputs["idx"].shape == (8, 64)
    assert graph.outputs == [("cross_entropy", 0)]
    assert not graph.unsupported
    qkv = graph.node("blocks_0_attn_qkv")
    assert qkv.module == "blocks.0.attn.qkv" and qkv.op == "linear"
    assert graph.node("scaled_dot_product_attention").module == "blocks.0.attn"
    # x.shape / w // heads are constants: no node for them
    assert not any("getattr" in n.name or "floordiv" in n.name for n in graph.nodes)
    edges = {(e.src, e.dst) for e in graph.edges}
    assert ("blocks_0_attn_qkv", "split") in edges


class LoopOverShape(nn.Module):
    """fx cannot trace ``range(x.size(1))``; torch.export specializes it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        for i in range(x.size(1)):
            y = y + 1.0
        return y.relu()


def test_fallback_to_export_gives_the_same_rules_and_flops():
    x = torch.randn(4, 3, 8)
    graph = autopar.trace(LoopOverShape(), (x,))
    assert graph.fx_graph.meta["autopar_frontend"] == "export"
    ops = [n.op for n in graph.nodes]
    assert ops == ["linear", "elementwise", "elementwise", "elementwise", "elementwise"]
    fc = graph.nodes[0]
    assert fc.flops == 2 * 4 * 3 * 8 * 8 and fc.module == "fc"
    assert [p.source for p in fc.params] == ["param:fc.weight", "param:fc.bias"]
    assert graph.nodes[-1].attrs["fn"] == "relu"


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4), Gate())

    def forward(self, x):
        return self.inner(x)


class Gate(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x
        return -x


def test_data_dependent_branch_fails_both_with_one_actionable_line():
    with pytest.raises(TraceError) as info:
        autopar.trace(Branchy(), (torch.randn(2, 4),))
    msg = str(info.value)
    print(msg)
    assert "\n" not in msg
    assert "inner.1" in msg and "if x.sum() > 0" in msg and "test_trace.py" in msg
    assert "torch.where" in msg and "torch.fx and torch.export" in msg


def test_wrong_input_shape_is_a_clear_error():
    model, (x, labels) = autopar.zoo.get("mlp")
    with pytest.raises(TraceError) as info:
        autopar.trace(model, (x[:, :10], labels))
    msg = str(info.value)
    print(msg)
    assert "\n" not in msg and "example_inputs" in msg and "(32, 10)" in msg and "layers.0" in msg


def test_wrong_number_of_inputs_is_a_value_error():
    model, (x, labels) = autopar.zoo.get("mlp")
    with pytest.raises(ValueError, match="example_inputs do not fit MLP.forward"):
        autopar.trace(model, (x, labels, labels))


def test_cli_prints_the_table(capsys):
    assert cli_main(["trace", "zoo:gpt:layers=1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("GPT:") and "blocks.0.attn.qkv" in out and "sdpa" in out


def test_a_function_is_not_a_model():
    """A bare function used to fail deep inside with an AttributeError on ``forward``."""
    with pytest.raises(TraceError, match="torch.nn.Module") as info:
        autopar.trace(lambda x: x * 2, (torch.randn(2, 4),))
    assert "\n" not in str(info.value)


def test_tracing_leaves_the_model_as_it_was_and_repeats_exactly():
    """fx parks tensors made while tracing on the traced module: it used to leave
    ``_tensor_constant0`` on the user's model, and a second trace then named its constant
    ``_tensor_constant1``, so its fingerprint differed and a saved plan was refused."""
    from autopar.core.fingerprint import fingerprint
    from tests.helpers.models import ConstantIndex  # h[torch.arange(4), 1:5]

    model, x = ConstantIndex(), (torch.randn(8, 8),)
    before = set(vars(model))
    first, second = autopar.trace(model, x), autopar.trace(model, x)
    assert first.frontend == second.frontend == "fx"  # not torch.export after a failed fx trace
    assert set(vars(model)) == before
    assert fingerprint(first) == fingerprint(second)
