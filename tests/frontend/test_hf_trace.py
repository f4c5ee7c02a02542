"""Tracing the models people train: six Hugging Face families, called as they are called.

Each model is traced from keyword inputs (``input_ids=..., labels=...``) through torch.export;
the graph records the call so that its flat outputs rebuild the model's own ``ModelOutput``, and
the references are independent: the eager model's output, torch's FlopCounterMode on meta.
"""

import pytest
import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

import autopar
from tests.helpers import hf_models

NAMES = hf_models.NAMES


@pytest.mark.parametrize("name", NAMES)
def test_traces_through_export_with_the_call_recorded(hf_traced, name):
    model, kwargs, graph = hf_traced[name]
    assert graph.frontend == "export" and isinstance(graph.program, torch.export.ExportedProgram)
    assert graph.fx_graph is graph.program.graph_module
    assert graph.call.input_names == list(kwargs)  # the keyword names are the graph's inputs
    assert list(graph.inputs) == list(kwargs)
    assert graph.call.batch == 2 and graph.call.dynamic_batch and set(graph.call.batched) == set(kwargs)
    assert graph.call.training is True
    state = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers()),
             **graph.program.constants}  # constants: the empty key/value cache tensors
    read = {p.source.removeprefix("param:") for n in graph.nodes for p in n.params}
    # every parameter is read, by one name (GPT-2's tied embedding and head are one tensor)
    assert {id(p) for p in model.parameters()} <= {id(state[q]) for q in read}
    assert graph.param_count == sum(state[q].numel() for q in read)
    names = {n.name for n in graph.fx_graph.graph.nodes}
    assert all(n.name in names for n in graph.nodes)


@pytest.mark.parametrize("name", NAMES)
def test_graph_outputs_rebuild_what_the_model_returns(hf_traced, name):
    model, kwargs, graph = hf_traced[name]
    expected = model(**kwargs)
    flat = graph.program.module()(**kwargs)  # the exported program returns the graph's outputs
    got = graph.call.unflatten(flat)
    assert type(got) is type(expected)
    torch.testing.assert_close(got.loss, expected.loss)
    torch.testing.assert_close(got.logits, expected.logits)
    assert [leaf.path for leaf in graph.call.outputs if not leaf.dropped] == ["loss", "logits"]
    assert graph.outputs[0] == (graph.nodes[[n.op for n in graph.nodes].index("cross_entropy")].name, 0)


def test_default_gpt2_traces_with_its_cache_dropped(hf_traced):
    model, kwargs, graph = hf_traced["gpt2"]
    assert model.config.use_cache  # the default config: export alone stops on the DynamicCache
    assert [(leaf.path, "DynamicCache" in leaf.dropped) for leaf in graph.call.dropped] == [("cache", True)]
    assert any("DynamicCache" in note for note in graph.call.notes)
    assert graph.call.unflatten(graph.program.module()(**kwargs)).past_key_values is None
    # the cache is built inside the graph ("cat" onto an empty cache): its axis still splits
    cats = [n for n in graph.nodes if n.op == "cat" and n.module.endswith("attn")]
    assert cats and all(d.splittable for n in cats for d in n.dims)


@pytest.mark.parametrize("name", NAMES)
def test_the_exported_batch_is_dynamic(hf_traced, name):
    model, _, graph = hf_traced[name]
    _, kwargs3 = hf_models.build(name, batch=3)
    got = graph.call.unflatten(graph.program.module()(**kwargs3))
    torch.testing.assert_close(got.loss, model(**kwargs3).loss)
    assert len(graph.call.check((), kwargs3)) == len(kwargs3)  # no error for the other batch size


def test_a_static_batch_is_recorded_and_another_size_is_one_line():
    model, kwargs = hf_models.build("bert", batch=1)
    graph = autopar.trace(model, kwargs)
    assert graph.call.batch == 1 and not graph.call.dynamic_batch
    assert any("batch size fixed at 1" in note for note in graph.call.notes)
    _, kwargs3 = hf_models.build("bert", batch=3)
    with pytest.raises(ValueError) as info:
        graph.call.check((), kwargs3)
    msg = str(info.value)
    assert "\n" not in msg and "batch size 3" in msg and "batch size 1 only" in msg


def test_a_call_that_is_not_the_traced_one_is_one_line(hf_traced):
    _, kwargs, graph = hf_traced["llama"]
    with pytest.raises(ValueError, match="missing labels") as info:
        graph.call.flatten((), {k: v for k, v in kwargs.items() if k != "labels"})
    assert "\n" not in str(info.value)
    assert [t.data_ptr() for t in graph.call.flatten((), dict(reversed(kwargs.items())))] == \
        [kwargs[k].data_ptr() for k in graph.call.input_names]  # by name, whatever the order


@pytest.mark.parametrize("name", NAMES)
def test_flops_match_flop_counter_on_meta(name):
    model, kwargs = hf_models.build(name, device="meta")
    with FlopCounterMode(display=False) as counter:
        # eager transformers asks attention_mask.all() (data) on meta; without it the same matmuls run
        model(**{k: v for k, v in kwargs.items() if k != "attention_mask"})
    graph = autopar.trace(model, kwargs)
    expected = counter.get_total_flops()
    print(f"{name}: autopar {graph.flops:,} FLOPs, FlopCounterMode {expected:,}")
    assert expected > 0 and abs(graph.flops - expected) <= 0.01 * expected
    assert all(p.is_meta for p in model.parameters())


def test_dropout_and_drop_path_trace_and_keep_their_splits():
    model, kwargs = hf_models.build("convnext", drop_path=0.5)
    graph = autopar.trace(model, kwargs)
    rand = [n for n in graph.unsupported if "rand" in n.target]
    assert rand and all("factory" in n.unsupported for n in rand)  # the random keep-mask, made whole
    scaled = [n for n in graph.nodes if n.op == "elementwise" and any(o.source == rand[0].name for o in n.inputs)]
    assert scaled and scaled[0].dims[0].splittable  # the mask's batch axis still splits
    bert, kw = hf_models.build("bert", dropout=0.1)
    drops = [n for n in autopar.trace(bert, kw).nodes if n.op == "dropout"]
    assert drops and all(n.attrs == {"p": 0.1, "training": True} for n in drops)


class KeywordModel(nn.Module):
    """A model fx traces, called with a keyword input and returning a dict."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x, mask=None, scale=2.0):
        y = self.fc(x) * scale
        if mask is not None:
            y = y * mask
        return {"out": y, "total": y.sum(), "note": 3}


def test_fx_takes_keyword_inputs_and_records_the_output_dict():
    x, mask = torch.randn(4, 8), torch.ones(4, 4)
    model = KeywordModel()
    graph = autopar.trace(model, (x,), {"mask": mask})
    assert graph.frontend == "fx" and graph.call.input_names == ["x", "mask"]
    assert [leaf.path for leaf in graph.call.inputs] == ["args[0]", "mask"]
    got = graph.call.unflatten([model(x, mask=mask)["out"], model(x, mask=mask)["total"]])
    assert set(got) == {"out", "total", "note"} and got["note"] == 3
    same = autopar.trace(model, {"x": x, "mask": mask})  # one dict: all keyword inputs
    assert [n.op for n in same.nodes] == [n.op for n in graph.nodes]


def test_bad_example_inputs_are_one_line_value_errors():
    model = KeywordModel()
    with pytest.raises(ValueError, match="example_inputs do not fit"):
        autopar.trace(model, (), {"y": torch.randn(4, 8)})
    with pytest.raises(ValueError, match="pass the keyword inputs once"):
        autopar.trace(model, {"x": torch.randn(4, 8)}, {"mask": torch.ones(4, 4)})
