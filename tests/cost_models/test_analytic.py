"""The analytic model against arithmetic done by hand here, and build_tables against explain.

All graphs are hand-built ir objects (the tracer is tested elsewhere): a linear, a matmul whose
reduction dim is split, a layer norm, an elementwise add, and a GPT block made of them.
"""

import math

import numpy as np
import pytest
from autopar.cost_models.analytic import AnalyticModel
from autopar.cost_models.explain import explain_plan
from autopar.cost_models.tables import build_tables

from autopar.core.cluster import Cluster
from autopar.core.ir import Dim, Graph, Node, Operand, TensorSpec
from autopar.core.tables import Config

PEAK, MEMBW, BW, LAT = 1e12, 1e11, 50e9, 5e-6
C8 = Cluster(devices=8, peak_flops={"float32": PEAK}, memory_bandwidth=MEMBW,
             intra_bandwidth=BW, intra_latency=LAT, inter_bandwidth=BW / 10, inter_latency=LAT * 2)
MODEL = AnalyticModel()  # efficiencies 0.6 (compute) and 0.8 (memory)
B, S, N, K = 8, 16, 64, 32


def spec(shape, axes, dtype="float32"):
    return TensorSpec(tuple(shape), dtype, tuple(a if isinstance(a, tuple) else (a,) for a in axes))


def ring_ar(nbytes, p=8, bw=BW, lat=LAT):
    return 2 * (p - 1) / p * nbytes / bw + 2 * (p - 1) * lat


def bucketed_ar(nbytes, p=8, bw=BW, lat=LAT):
    """A gradient all-reduce inside the runtime's 25 MiB buckets: all of its bandwidth term, and
    the share of one bucket's latency that its bytes fill."""
    return 2 * (p - 1) / p * nbytes / bw + 2 * (p - 1) * lat * min(1.0, nbytes / (25 * 2**20))


def linear(name, src, b=B, s=S, n=N, k=K, dtype="float32"):
    x = Operand(src, 0, spec((b, s, k), "bsk", dtype))
    w = Operand(f"param:{name}.weight", 0, spec((n, k), "nk", dtype))
    bias = Operand(f"param:{name}.bias", 0, spec((n,), "n", dtype))
    return Node(name, "linear", "torch.nn.Linear", name,
                (Dim("b", b), Dim("s", s), Dim("n", n), Dim("k", k, reduction=True)),
                (x,), (w, bias), (spec((b, s, n), "bsn", dtype),), flops=2 * b * s * n * k)


def elementwise(name, op, srcs, b=B, s=S, c=N, dtype="float32"):
    ins = tuple(Operand(x, 0, spec((b, s, c), "bsc", dtype)) for x in srcs)
    return Node(name, op, op, name, (Dim("b", b), Dim("s", s), Dim("c", c)), ins, (),
                (spec((b, s, c), "bsc", dtype),))


def layer_norm(name, src, b=B, s=S, c=N, dtype="float32"):
    x = Operand(src, 0, spec((b, s, c), "bsc", dtype))
    ps = tuple(Operand(f"param:{name}.{p}", 0, spec((c,), "c", dtype)) for p in ("weight", "bias"))
    return Node(name, "layer_norm", "torch.nn.LayerNorm", name,
                (Dim("b", b), Dim("s", s), Dim("c", c, splittable=False)), (x,), ps,
                (spec((b, s, c), "bsc", dtype),))


def matmul(name, a, b, m=32, k=64, n=16):
    ins = (Operand(a, 0, spec((m, k), "mk")), Operand(b, 0, spec((k, n), "kn")))
    return Node(name, "matmul", "torch.matmul", name,
                (Dim("m", m), Dim("n", n), Dim("k", k, reduction=True)), ins, (),
                (spec((m, n), "mn"),), flops=2 * m * n * k)


def attention(name, src, b, s, heads, w, dtype="float32"):
    d = w // heads
    x = Operand(src, 0, spec((b, s, 3 * w), ("b", "s", ("three", "h", "d")), dtype))
    return Node(name, "attention", "F.scaled_dot_product_attention", name,
                (Dim("b", b), Dim("s", s), Dim("three", 3, splittable=False), Dim("h", heads),
                 Dim("d", d, splittable=False)), (x,), (),
                (spec((b, s, w), ("b", "s", ("h", "d")), dtype),), flops=4 * b * s * s * w)


def gpt_graph(layers=2, b=8, s=64, w=128, heads=4, dtype="float32"):
    nodes, x = [], "input:x"
    for i in range(layers):
        p = f"l{i}."
        nodes += [layer_norm(p + "ln1", x, b, s, w, dtype),
                  linear(p + "qkv", p + "ln1", b, s, 3 * w, w, dtype),
                  attention(p + "attn", p + "qkv", b, s, heads, w, dtype),
                  linear(p + "proj", p + "attn", b, s, w, w, dtype),
                  elementwise(p + "add1", "add", [x, p + "proj"], b, s, w, dtype),
                  layer_norm(p + "ln2", p + "add1", b, s, w, dtype),
                  linear(p + "fc1", p + "ln2", b, s, 4 * w, w, dtype),
                  elementwise(p + "gelu", "gelu", [p + "fc1"], b, s, 4 * w, dtype),
                  linear(p + "fc2", p + "gelu", b, s, w, 4 * w, dtype),
                  elementwise(p + "add2", "add", [p + "add1", p + "fc2"], b, s, w, dtype)]
        x = p + "add2"
    return Graph(nodes, {"x": spec((b, s, w), ((), (), ()), dtype)}, [(x, 0)], "gpt-hand")


def cfg(node, **axes):
    """Config(dim=mesh axes...) by dim name, e.g. cfg(lin, b=(0, 1, 2))."""
    names = [d.name for d in node.dims]
    ma = [tuple(axes.get(n, ())) for n in names]
    return Config(tuple(2 ** len(a) for a in ma), tuple(ma))


PARAM_BYTES = (N * K + N) * 4
X_BYTES, Y_BYTES = B * S * K * 4, B * S * N * 4


def term(cost, prefix):
    return [t for t in cost.terms if t.label.startswith(prefix)]


def test_data_parallel_linear_by_hand():
    lin = linear("fc", "input:x")
    c = cfg(lin, b=(0, 1, 2))
    bd = MODEL.node_breakdown(lin, c, C8)
    t_flops = 2 * B * S * N * K / 8 / (PEAK * 0.6)
    t_mem = (X_BYTES / 8 + PARAM_BYTES + Y_BYTES / 8) / (MEMBW * 0.8)
    fwd = max(t_flops, t_mem)
    assert term(bd, "compute forward")[0].seconds == pytest.approx(fwd)
    assert term(bd, "compute backward")[0].seconds == pytest.approx(2 * fwd)
    (sync,) = term(bd, "weight-grad")
    # the weight-gradient all-reduce moves exactly the parameter bytes, over all 8 devices
    assert sync.seconds == pytest.approx(bucketed_ar(PARAM_BYTES))
    assert f"{PARAM_BYTES:.6g}" in sync.formula
    assert bd.seconds == pytest.approx(3 * fwd + bucketed_ar(PARAM_BYTES))
    assert MODEL.node_cost(lin, [c], C8)[0] == pytest.approx(bd.seconds)


def test_inference_prices_the_forward_only():
    lin = linear("fc", "input:x")
    c = cfg(lin, b=(0, 1, 2))
    train = MODEL.node_breakdown(lin, c, C8)
    inf = MODEL.node_breakdown(lin, c, C8, mode="inference")
    assert [t.label for t in inf.terms] == ["compute forward"]
    assert inf.seconds == pytest.approx(term(train, "compute forward")[0].seconds)
    with pytest.raises(ValueError):
        MODEL.node_breakdown(lin, c, C8, mode="serving")


def test_tiny_shards_are_not_free():
    lin = linear("fc", "input:x", b=8, s=1, n=8, k=8)
    c = cfg(lin, n=(0, 1, 2))
    fwd = term(MODEL.node_breakdown(lin, c, C8), "compute forward")[0]
    # 2*8*8*8/8 FLOPs is nothing; the bytes moved (x replicated, W and bias sharded) are not
    local = (8 * 8 * 4) + (8 * 8 * 4 + 8 * 4) / 8 + 8 * 8 * 4 / 8
    assert fwd.seconds == pytest.approx(local / (MEMBW * 0.8))
    assert "memory-bound" in fwd.formula


def test_column_parallel_linear_input_gradient_is_all_reduced():
    prev = elementwise("prev", "gelu", ["input:x"], c=K)
    lin = linear("fc", "prev")
    col = cfg(lin, n=(0, 1, 2))
    assert term(MODEL.node_breakdown(lin, col, C8), "weight-grad") == []  # W and b are sharded
    m = MODEL.edge_cost(prev, 0, lin, 0, [cfg(prev)], [col], C8)
    # forward: x is already replicated; backward: dx is a partial sum over the 8 column blocks
    assert m[0, 0] == pytest.approx(ring_ar(X_BYTES))
    assert MODEL.edge_cost(prev, 0, lin, 0, [cfg(prev)], [col], C8, mode="inference")[0, 0] == 0


def test_matmul_with_split_reduction_dim():
    mm = matmul("mm", "input:a", "input:b")
    k_split = cfg(mm, k=(0, 1, 2))
    out_bytes = 32 * 16 * 4
    add_r = Node("add", "add", "add", "", (Dim("m", 32), Dim("n", 16)),
                 (Operand("mm", 0, spec((32, 16), "mn")), Operand("input:c", 0, spec((32, 16), "mn"))),
                 (), (spec((32, 16), "mn"),))
    # consumer replicated: the partial sums are all-reduced in the forward, nothing comes back
    m = MODEL.edge_cost(mm, 0, add_r, 0, [k_split], [cfg(add_r)], C8)
    assert m[0, 0] == pytest.approx(ring_ar(out_bytes))
    # consumer split over m: reduce-scatter forward, all-gather of the gradient backward
    m = MODEL.edge_cost(mm, 0, add_r, 0, [k_split], [cfg(add_r, m=(0, 1, 2))], C8)
    one_way = 7 / 8 * out_bytes / BW + 7 * LAT
    assert m[0, 0] == pytest.approx(2 * one_way)
    lines, total = MODEL.explain_edge(mm, 0, add_r, 0, k_split, cfg(add_r, m=(0, 1, 2)), C8)
    assert "reduce-scatter" in lines[1] and "all-gather" in lines[2]
    assert total == pytest.approx(2 * one_way)


def test_layer_norm_and_add_are_memory_bound():
    ln = layer_norm("ln", "input:x")
    c = cfg(ln, b=(0, 1, 2))
    fwd = term(MODEL.node_breakdown(ln, c, C8), "compute forward")[0].seconds
    assert fwd == pytest.approx((2 * Y_BYTES / 8 + 2 * N * 4) / (MEMBW * 0.8))
    add = elementwise("add", "add", ["input:x", "input:y"])
    fwd = term(MODEL.node_breakdown(add, cfg(add, s=(0,)), C8), "compute forward")[0].seconds
    assert fwd == pytest.approx(3 * Y_BYTES / 2 / (MEMBW * 0.8))


def test_node_cost_uses_declared_bytes_when_given():
    ln = layer_norm("ln", "input:x")
    ln.bytes_read, ln.bytes_written = 1000, 0
    c = cfg(ln, b=(0, 1, 2))
    fwd = term(MODEL.node_breakdown(ln, c, C8), "compute forward")[0].seconds
    frac = (2 * Y_BYTES / 8 + 2 * N * 4) / (2 * Y_BYTES + 2 * N * 4)
    assert fwd == pytest.approx(1000 * frac / (MEMBW * 0.8))


def test_node_crossing_groups_use_the_inter_node_link():
    c16 = Cluster.preset("2x8xH100")
    lin = linear("fc", "input:x", b=16)
    sync_inside = term(MODEL.node_breakdown(lin, cfg(lin, b=(1, 2, 3)), c16), "weight-grad")[0]
    sync_all = term(MODEL.node_breakdown(lin, cfg(lin, b=(0, 1, 2, 3)), c16), "weight-grad")[0]
    assert sync_inside.seconds == pytest.approx(bucketed_ar(PARAM_BYTES, 8, c16.intra_bandwidth, c16.intra_latency))
    assert sync_all.seconds == pytest.approx(bucketed_ar(PARAM_BYTES, 16, c16.inter_bandwidth, c16.inter_latency))


def test_build_tables_matches_explain_plan_on_a_gpt_block():
    g = gpt_graph(layers=2)
    cluster = Cluster.preset("8xA100")
    t = build_tables(g, cluster)
    assert t.units == "s" and t.memory_capacity == 80e9 and len(t.nodes) == len(g.nodes)
    for (u, v), m in t.edge_cost.items():
        assert u < v and m.shape == (len(t.configs[u]), len(t.configs[v]))
    # identical layers share their vectors (exact cache keyed by signature)
    assert t.node_cost[5] is t.node_cost[15] and t.configs[1] is t.configs[11]
    assert t.edge_cost[(1, 2)] is t.edge_cost[(11, 12)]
    rng = np.random.default_rng(0)
    for trial in range(3):
        choice = [int(rng.integers(len(c))) for c in t.configs]
        by_name = {n.name: t.configs[i][c] for i, (n, c) in enumerate(zip(g.nodes, choice))}
        lines = explain_plan(g, by_name, cluster)
        predicted = float(lines[-1].split("=")[-1].split()[0])
        assert predicted == pytest.approx(t.total(choice), rel=1e-4)
    assert any("2·b·s·n·k = 2·8·64·384·128" in line for line in lines)


def test_megatron_layer_explained_on_8xA100():
    g = gpt_graph(layers=1, b=8, s=1024, w=1024, heads=16, dtype="bfloat16")
    cluster = Cluster.preset("8xA100")
    tp = (0, 1, 2)
    choice = {}
    for n in g.nodes:
        if n.op == "linear":
            col = n.name.endswith(("qkv", "fc1"))
            choice[n.name] = cfg(n, n=tp) if col else cfg(n, k=tp)
        elif n.op == "attention":
            choice[n.name] = cfg(n, h=tp)
        elif n.op == "gelu":
            choice[n.name] = cfg(n, c=tp)
        else:
            choice[n.name] = cfg(n)
    lines = explain_plan(g, choice, cluster)
    text = "\n".join(lines)
    # row-parallel outputs are partial sums: all-reduced on the way to the replicated residual add
    assert "l0.proj:0 -> l0.add1:1" in text and "all-reduce" in text
    assert "3.12e+14 [bfloat16] * 0.6" in text
    t = build_tables(g, cluster)
    idx = [t.configs[i].index(choice[n.name]) for i, n in enumerate(g.nodes)]
    assert float(lines[-1].split("=")[-1].split()[0]) == pytest.approx(t.total(idx), rel=1e-4)


def test_unsupported_node_gets_only_the_replicated_config():
    g = gpt_graph(layers=1)
    g.nodes[2].unsupported = "no rule for sdpa"
    t = build_tables(g, C8)
    assert len(t.configs[2]) == 1 and t.configs[2][0].splits == (1,) * 5
    assert np.isfinite(t.node_cost[2]).all()


def test_parallel_edges_are_summed_and_outputs_reduced():
    lin = linear("fc", "input:x")
    sq = Node("sq", "mul", "mul", "", (Dim("b", B), Dim("s", S), Dim("c", N)),
              (Operand("fc", 0, spec((B, S, N), "bsc")),) * 2, (), (spec((B, S, N), "bsc"),))
    g = Graph([lin, sq], {"x": spec((B, S, K), ((), (), ()))}, [("sq", 0), ("fc", 0)])
    t = build_tables(g, C8)
    single = MODEL.edge_cost(lin, 0, sq, 0, t.configs[0], t.configs[1], C8)
    assert np.allclose(t.edge_cost[(0, 1)], 2 * single)
    # fc is also a graph output: configs that leave it partial pay an all-reduce
    k_all = t.configs[0].index(cfg(lin, k=(0, 1, 2)))
    base = MODEL.node_cost(lin, [t.configs[0][k_all]], C8)[0]
    assert t.node_cost[0][k_all] == pytest.approx(base + ring_ar(Y_BYTES))


def test_inference_tables_have_no_backward():
    g = gpt_graph(layers=1)
    tr, inf = build_tables(g, C8), build_tables(g, C8, mode="inference")
    assert all((i <= t + 1e-15).all() for i, t in zip(inf.node_cost, tr.node_cost))
    assert all(np.all(inf.memory[i] <= tr.memory[i]) for i in range(len(g.nodes)))
    assert math.isclose(float(inf.node_cost[1][0]) * 3, float(tr.node_cost[1][0]))


def test_vectorised_node_cost_and_memory_equal_the_breakdowns():
    from autopar.cost_models.memory import node_memory, node_memory_vector

    from autopar.core.space import mesh_configs

    cluster = Cluster.preset("2x8xH100")
    mesh = cluster.mesh()
    g = gpt_graph(layers=1, b=16, s=32, w=64, heads=4)
    g.nodes.append(matmul("mm", "input:a", "input:b"))
    for n in g.nodes:
        cfgs = mesh_configs(n, mesh)
        for mode in ("train", "inference"):
            vec = MODEL.node_cost(n, cfgs, cluster, mode)
            ref = [MODEL.node_breakdown(n, c, cluster, mode, text=False).seconds for c in cfgs]
            assert np.allclose(vec, ref, rtol=1e-12, atol=0), (n.name, mode)
            mem = node_memory_vector(n, cfgs, mesh, mode, "adam", frozenset({"param:l0.qkv.bias"}))
            ref = [node_memory(n, c, mesh, mode, "adam", frozenset({"param:l0.qkv.bias"})).total
                   for c in cfgs]
            assert np.allclose(mem, ref, rtol=1e-12, atol=0), (n.name, mode)


def test_view_ops_move_nothing_and_subclasses_keep_their_breakdown():
    x = Operand("prev", 0, spec((B, S, N), "bsc"))
    view = Node("v", "view", "Tensor.view", "", (Dim("b", B), Dim("s", S), Dim("c", N)), (x,), (),
                (spec((B, S, N), "bsc"),))
    assert MODEL.node_cost(view, [cfg(view)], C8)[0] == 0.0

    class Doubled(AnalyticModel):
        def node_breakdown(self, node, config, cluster, mode="train", text=True, layouts=None):
            nc = super().node_breakdown(node, config, cluster, mode, text, layouts)
            nc.terms = nc.terms + nc.terms
            return nc

    lin = linear("fc", "input:x")
    c = cfg(lin, b=(0, 1, 2))
    assert Doubled().node_cost(lin, [c], C8)[0] == pytest.approx(2 * MODEL.node_cost(lin, [c], C8)[0])


def batch_norm(name, src, b=B, c=N, h=4, w=4):
    x = Operand(src, 0, spec((b, c, h, w), "bchw"))
    wt = Operand(f"param:{name}.weight", 0, spec((c,), "c"))
    bias = Operand(f"param:{name}.bias", 0, spec((c,), "c"))
    return Node(name, "batch_norm", "torch.nn.BatchNorm2d", name,
                (Dim("b", b), Dim("c", c), Dim("h", h), Dim("w", w)),
                (x,), (wt, bias), (spec((b, c, h, w), "bchw"),))


def test_batch_norm_with_split_batch_pays_two_statistics_all_reduces():
    """codegen/batchnorm.py all-reduces the mean and the variance (C floats each, the local
    channels) over the mesh axes that cut the batch, in the forward of training only."""
    from autopar.core.space import mesh_configs

    bn = batch_norm("bn", "input:x")
    dp = MODEL.node_breakdown(bn, cfg(bn, b=(0, 1, 2)), C8)
    (stats,) = term(dp, "batch-norm statistics")
    assert stats.seconds == pytest.approx(2 * ring_ar(N * 4))
    # channels split over axis 2, batch over axes 0, 1: C/2 floats over a group of 4
    mixed = MODEL.node_breakdown(bn, cfg(bn, b=(0, 1), c=(2,)), C8)
    (stats,) = term(mixed, "batch-norm statistics")
    assert stats.seconds == pytest.approx(2 * ring_ar(N * 4 / 2, p=4))
    assert not term(MODEL.node_breakdown(bn, cfg(bn, c=(0, 1, 2)), C8), "batch-norm")
    assert not term(MODEL.node_breakdown(bn, cfg(bn, b=(0, 1, 2)), C8, mode="inference"),
                    "batch-norm")
    for cluster in (C8, Cluster.preset("2x8xH100")):
        cfgs = mesh_configs(bn, cluster.mesh())
        for mode in ("train", "inference"):
            vec = MODEL.node_cost(bn, cfgs, cluster, mode)
            ref = [MODEL.node_breakdown(bn, c, cluster, mode, text=False).seconds for c in cfgs]
            assert np.allclose(vec, ref, rtol=1e-12, atol=0), mode


# bytes one fused fp32 update moves per element (C8 runs no foreach update): the gradient read (4),
# each moment read and written (2 x 4 per moment: Adam/AdamW 2, SGD's momentum 1), the weight read
# and written (2 x 4)
@pytest.mark.parametrize("optimizer,moved", [("adamw", 4 + 2 * 2 * 4 + 2 * 4), ("adam", 4 + 2 * 2 * 4 + 2 * 4),
                                             ("sgd", 4 + 2 * 1 * 4 + 2 * 4)])
def test_optimizer_update_is_a_memory_pass_over_each_devices_parameter_elements(optimizer, moved):
    """Replicated parameters (data parallelism) are updated whole on every device, sharded ones in
    part, and ZeRO splits the update over the data-parallel devices: elements counted by hand."""
    import dataclasses

    from autopar.core.strategy import NodeTraining

    node = linear("l", "input:x")
    model = AnalyticModel(optimizer=optimizer)
    per_element = moved / (MEMBW * 0.8)

    def update(n, splits, mode="train"):
        terms = model.node_breakdown(n, Config(splits), C8, mode).terms
        return sum(t.seconds for t in terms if t.kind == "optimizer")

    assert math.isclose(update(node, (8, 1, 1, 1)), (N * K + N) * per_element)  # data parallel
    assert math.isclose(update(node, (1, 1, 8, 1)), (N * K + N) / 8 * per_element)  # weight and bias split
    assert math.isclose(update(node, (1, 1, 1, 8)), (N * K / 8 + N) * per_element)  # bias whole
    assert update(node, (8, 1, 1, 1), "inference") == 0
    assert AnalyticModel().node_breakdown(node, Config((8, 1, 1, 1)), C8).seconds < \
        model.node_breakdown(node, Config((8, 1, 1, 1)), C8).seconds  # None: not priced
    zero = dataclasses.replace(node, attrs={**node.attrs, "train": NodeTraining(zero=1)})
    assert math.isclose(update(zero, (8, 1, 1, 1)), (N * K + N) / 8 * per_element)
    assert math.isclose(update(zero, (2, 1, 4, 1)), (N * K + N) / 8 * per_element)
    # the vectorised tables price the same update
    from autopar.core.space import mesh_configs

    cfgs = mesh_configs(node, C8.mesh())
    with_update = model.node_cost(node, cfgs, C8) - AnalyticModel().node_cost(node, cfgs, C8)
    assert np.allclose(with_update, [update(node, c.splits) for c in cfgs], rtol=1e-9)
