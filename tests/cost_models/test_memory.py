"""Per-device memory: sharded parameters, gradients, optimizer state, saved activations."""

import pytest

from autopar.core.ir import Dim, Graph, Node, Operand, TensorSpec
from autopar.core.tables import Config, Mesh
from autopar.cost_models.memory import node_memory, plan_memory

MESH = Mesh((2, 2, 2), (0, 0, 0))
B, S, N, K = 8, 16, 64, 32


def linear(name="fc", src="input:x", weight="param:fc.weight"):
    x = Operand(src, 0, TensorSpec((B, S, K), "float32", (("b",), ("s",), ("k",))))
    w = Operand(weight, 0, TensorSpec((N, K), "float32", (("n",), ("k",))))
    bias = Operand(weight + ".bias", 0, TensorSpec((N,), "float32", (("n",),)))
    return Node(name, "linear", "torch.nn.Linear", name,
                (Dim("b", B), Dim("s", S), Dim("n", N), Dim("k", K, reduction=True)),
                (x,), (w, bias), (TensorSpec((B, S, N), "float32", (("b",), ("s",), ("n",))),),
                flops=2 * B * S * N * K)


REPL = Config((1, 1, 1, 1), ((), (), (), ()))
COLUMN = Config((1, 1, 8, 1), ((), (), (0, 1, 2), ()))
DATA = Config((8, 1, 1, 1), ((0, 1, 2), (), (), ()))
PARAM_BYTES = (N * K + N) * 4
X_BYTES = B * S * K * 4


def test_replicated_linear_by_hand():
    m = node_memory(linear(), REPL, MESH)
    assert m.params == PARAM_BYTES
    assert m.grads == PARAM_BYTES
    assert m.optimizer == 2 * 4 * (N * K + N)  # Adam: two fp32 moments
    assert m.activations == X_BYTES  # x is saved for dW
    assert m.total == 4 * PARAM_BYTES + X_BYTES


def test_column_parallel_holds_one_pth_of_the_state():
    rep, col = node_memory(linear(), REPL, MESH), node_memory(linear(), COLUMN, MESH)
    for field in ("params", "grads", "optimizer"):
        assert getattr(col, field) == pytest.approx(getattr(rep, field) / 8)
    assert col.activations == rep.activations  # x is replicated under a column split
    inf_rep = node_memory(linear(), REPL, MESH, mode="inference")
    inf_col = node_memory(linear(), COLUMN, MESH, mode="inference")
    assert inf_col.total == pytest.approx(inf_rep.total / 8) and inf_rep.total == PARAM_BYTES


def test_data_parallel_shards_activations_only():
    m = node_memory(linear(), DATA, MESH)
    assert m.params == PARAM_BYTES and m.activations == X_BYTES / 8


def test_optimizers():
    assert node_memory(linear(), REPL, MESH, optimizer="sgd").optimizer == 4 * (N * K + N)
    assert node_memory(linear(), REPL, MESH, optimizer=None).optimizer == 0
    with pytest.raises(ValueError):
        node_memory(linear(), REPL, MESH, optimizer="lion9")


def test_ops_that_save_nothing_or_their_output():
    spec = TensorSpec((B, S), "float32", (("b",), ("c",)))
    dims = (Dim("b", B), Dim("c", S))
    add = Node("add", "add", "add", "", dims, (Operand("a", 0, spec), Operand("b", 0, spec)), (), (spec,))
    sm = Node("sm", "softmax", "softmax", "", dims, (Operand("a", 0, spec),), (), (spec,))
    cfg = Config((2, 1), ((0,), ()))
    assert node_memory(add, cfg, MESH).total == 0
    assert node_memory(sm, cfg, MESH).activations == spec.nbytes / 2


def test_shared_parameter_counted_once():
    a = linear("a", "input:x", "param:shared")
    b = linear("b", "input:x", "param:shared")
    g = Graph([a, b], {"x": TensorSpec((B, S, K), "float32", ((), (), ()))}, [("b", 0)])
    total, per = plan_memory(g, {"a": REPL, "b": REPL}, MESH)
    assert per["b"].params == 0 and per["a"].params == PARAM_BYTES
    assert total == 4 * PARAM_BYTES + X_BYTES  # x, read by both for dW, is one saved tensor


def test_traced_elementwise_add_saves_nothing_but_gelu_does():
    spec = TensorSpec((B, S), "float32", (("d0",), ("d1",)))
    dims = (Dim("d0", B), Dim("d1", S))
    add = Node("add", "elementwise", "operator.add", "", dims, (Operand("a", 0, spec),) * 2, (), (spec,),
               attrs={"fn": "add"})
    gelu = Node("gelu", "elementwise", "F.gelu", "", dims, (Operand("a", 0, spec),), (), (spec,),
                attrs={"fn": "gelu"})
    assert node_memory(add, Config((1, 1), ((), ())), MESH).total == 0
    assert node_memory(gelu, Config((1, 1), ((), ())), MESH).activations == spec.nbytes


def _backward_peak(loss) -> int:
    """Highest bytes the CPU allocator holds during ``loss.backward()`` above what it held before
    (torch.profiler's allocation events): the backward's own working set, measured."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        loss.backward()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    running = peak = 0
    for _, nbytes in events:
        running += nbytes
        peak = max(peak, running)
    return peak


@pytest.mark.parametrize("split", [1, 2])
def test_cross_entropy_backward_working_set_matches_the_allocator(split):
    """The loss's backward holds the gradient of the log-probabilities and of the logits at once:
    the model's ``transient`` (per node and in the config vector the searches read) is what the
    allocator measures on a local shard of the logits."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from autopar.core.space import configs_for
    from autopar.cost_models.memory import node_memory_vector
    from autopar.frontend.trace import trace

    rows, vocab = 64, 512

    class Loss(torch.nn.Module):
        def forward(self, logits, target):
            return F.cross_entropy(logits, target)

    graph = trace(Loss(), (torch.randn(rows, vocab), torch.randint(0, vocab, (rows,))))
    node = next(n for n in graph.nodes if n.op == "cross_entropy")
    mesh = Mesh((2,), (0,))
    configs = [c for c in configs_for(node, mesh) if c.splits[0] == split and all(s == 1 for s in c.splits[1:])]
    assert configs, "no config splits the rows alone"
    torch.manual_seed(0)
    logits = torch.randn(rows // split, vocab, requires_grad=True)
    measured = _backward_peak(F.cross_entropy(logits, torch.randint(0, vocab, (rows // split,))))
    model = node_memory(node, configs[0], mesh)
    assert model.transient == pytest.approx(measured, rel=0.01)
    assert node_memory_vector(node, configs[:1], mesh)[0] == pytest.approx(model.total)
    assert np.isclose(model.total - model.activations - model.params, model.transient)


def saved_bytes(model, *inputs) -> int:
    """What autograd keeps for the backward of ``model(*inputs)``: the bytes its saved-tensor hooks
    see, each storage once, the parameters and buffers left out (the model's state, held anyway:
    the measure the model is checked against)."""
    import torch

    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*inputs)
    params = {p.untyped_storage().data_ptr() for p in [*model.parameters(), *model.buffers()]}
    return sum(b for ptr, b in saved.items() if ptr not in params)


def replicated(graph) -> dict[str, Config]:
    """Every node of ``graph`` on one device, nothing split."""
    return {n.name: Config((1,) * len(n.dims), ((),) * len(n.dims)) for n in graph.nodes}


def modelled_activations(graph) -> int:
    """The activations the plan's memory keeps for ``graph`` on one device."""
    from autopar.core.cluster import Cluster

    _, per = plan_memory(graph, replicated(graph), Cluster.preset("cpu", devices=1).mesh())
    return sum(b.activations for b in per.values())


def test_saved_activations_match_what_autograd_saves():
    """A mean, a product with a number, an expand and a dropout with p = 0 save nothing; a dropout
    with p > 0 its mask (on a CPU in the input's dtype); a linear its input: the model's activations are the bytes autograd's
    saved-tensor hooks see (each storage once, the parameters left out)."""
    import torch
    import torch.nn.functional as F

    from autopar.frontend.trace import trace

    class Ops(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 48)

        def forward(self, x):
            h = self.lin(x)
            a = h.mean(-1, keepdim=True)
            d = F.dropout(F.dropout(h * 0.5, 0.0, True), 0.3, True)
            return (d + a.expand_as(h)).sum()

    model, x = Ops(), torch.randn(16, 24, 32)
    measured = saved_bytes(model, x)
    graph = trace(model, (x,))
    one, choice = Mesh((1,), (0,)), replicated(graph)
    modelled = sum(node_memory(n, choice[n.name], one).activations for n in graph.nodes)  # node by node
    assert measured == x.nbytes + x.numel() // 32 * 48 * 4  # x for the linear's dW, the dropout's mask
    assert modelled == measured


def test_a_tensor_several_backward_formulas_read_is_saved_once():
    """An RMS norm: its input is read by the square's and the product's backward, the reciprocal
    root's result by its own backward and the product's: autograd keeps each once, and so does
    the plan's memory (``plan_memory`` and the tables the searches read)."""
    import torch

    from autopar.core.cluster import Cluster
    from autopar.cost_models.tables import build_tables
    from autopar.frontend.trace import trace

    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(32, 48), torch.nn.Linear(48, 16)

        def forward(self, x):
            h = self.a(x)
            return self.b(h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).sum()

    model, x = Norm(), torch.randn(16, 24, 32)
    measured = saved_bytes(model, x)
    assert measured == 4 * 16 * 24 * (32 + 48 + 1 + 48)  # x, h, the root's result, the normed h
    graph = trace(model, (x,))
    cluster = Cluster.preset("cpu", devices=1)
    total, per = plan_memory(graph, replicated(graph), cluster.mesh())
    assert sum(b.activations for b in per.values()) == measured
    tables = build_tables(graph, cluster, "analytic")
    picks = [next(i for i, c in enumerate(cs) if all(s == 1 for s in c.splits)) for cs in tables.configs]
    assert tables.total_memory(picks) == pytest.approx(total)


def test_what_needs_no_gradient_is_not_kept_for_one():
    """A table made from positions (as a rotary embedding's cos) needs no gradient: the ops making
    it keep nothing, and its product with an activation keeps the table only (the activation's
    gradient reads it), as the saved-tensor hooks see."""
    import torch

    from autopar.frontend.trace import trace

    class Rot(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 48)

        def forward(self, x):
            table = torch.cos(torch.arange(x.shape[1], dtype=x.dtype, device=x.device)[:, None] * 0.1)
            return (self.lin(x) * table).sum()

    model, x = Rot(), torch.randn(16, 24, 32)
    measured = saved_bytes(model, x)
    assert measured == x.nbytes + 24 * 4  # x for dW, the (24, 1) table
    assert modelled_activations(trace(model, (x,))) == measured


def test_a_dropout_with_p_0_passes_the_same_tensor_on():
    """softmax -> dropout(p=0) -> matmul: the matmul's saved probabilities are the softmax's saved
    output (the dropout returns its input), one tensor for autograd and for the model."""
    import torch
    import torch.nn.functional as F

    from autopar.frontend.trace import trace

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.v = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

        def forward(self, x):
            p = F.dropout(torch.softmax(self.q(x) @ x.transpose(1, 2), dim=-1), 0.0, True)
            return (p @ self.v(x)).sum()

    model, x = Attn(), torch.randn(4, 24, 32)
    measured = saved_bytes(model, x)
    assert modelled_activations(trace(model, (x,))) == measured
