"""autopar.plan end to end: PaSE's published optima, dp == ilp, memory limits, baselines, errors."""

import re

import pytest

import autopar
from autopar.core.margin import device_memory_for
from autopar.core.errors import InfeasibleError
from autopar.search.brute import brute
from autopar.core.tables import restrict

# PaSE's tool, pase.md section 8: optimum and pure data parallelism (r = 5000).
PASE = {
    "alexnet": ("pase", {4: (148215719552, 577556866496), 8: (97098296512, 601108833248),
                         16: (70320712672, 612884816624), 32: (53136349552, 618772808312),
                         64: (41120456048, 618772808312)}),
    "rnnlm": ("pase:1", {4: (6866837733376, 9435357388800), 8: (4024963186688, 7101223014400),
                         16: (2476066881536, 5934155827200), 32: (1491938058240, 5350622233600),
                         64: (935818633216, 5058855436800)}),
}


@pytest.fixture(scope="module")
def pase_graphs():
    out = {}
    for name in PASE:
        model, inputs = autopar.zoo.get(name, device="meta")
        out[name] = (model, inputs, autopar.trace(model, inputs))
    return out


@pytest.mark.parametrize("name", list(PASE))
@pytest.mark.parametrize("p", [4, 8, 16, 32, 64])
def test_pase_optimum_and_data_parallel_match_the_published_totals(pase_graphs, name, p):
    model, inputs, graph = pase_graphs[name]
    space, table = PASE[name]
    plan = autopar.plan(model, inputs, autopar.Cluster(devices=p), cost_model="pase", space=space, graph=graph)
    best, data_parallel = table[p]
    print(f"{name} p={p}: autopar {plan.cost:.0f} PaSE {best}; data parallel {plan.baselines['data_parallel'].cost:.0f}")
    assert plan.cost == pytest.approx(best, rel=1e-6)
    assert plan.baselines["data_parallel"].cost == pytest.approx(data_parallel, rel=1e-6)
    assert plan.search.gap == 0.0


@pytest.fixture(scope="module")
def mlp():
    return autopar.zoo.get("mlp", layers=2)


def test_dp_and_ilp_agree_and_beat_data_parallel(mlp):
    model, inputs = mlp
    a = autopar.plan(model, inputs, "8xA100", search="dp")
    b = autopar.plan(model, inputs, "8xA100", search="ilp")
    assert a.cost == pytest.approx(b.cost, rel=1e-6)
    assert a.cost <= a.baselines["data_parallel"].cost * (1 + 1e-9)
    # the plan's cost is what its assignment costs in the tables it came from
    choice = [a.tables.configs[i].index(a.assignment[n]) for i, n in enumerate(a.tables.nodes)]
    assert a.tables.total(choice) == pytest.approx(a.cost)


def test_dp_optimum_equals_brute_force_on_a_reduced_space(mlp):
    model, inputs = mlp
    plan = autopar.plan(model, inputs, autopar.Cluster(devices=4), baselines=False)
    t = plan.tables
    keep = [list(range(min(3, len(c)))) for c in t.configs]  # small enough for brute force
    sub = restrict(t, keep)
    from autopar.search.dp import dp

    assert dp(sub).cost == pytest.approx(brute(sub).cost, rel=1e-9)


@pytest.fixture(scope="module")
def big_gpt():
    # Adam state of ~50M parameters (16 bytes each with grads) is ~0.8 GB: too much for 0.5 GB devices
    return autopar.zoo.get("gpt", layers=2, width=1024, heads=16, vocab=8192, seq=128, batch=8, device="meta")


def test_a_memory_limit_that_data_parallelism_cannot_meet_is_met_by_splitting(big_gpt):
    model, inputs = big_gpt
    free = autopar.plan(model, inputs, "8xA100")
    dp_mem = free.baselines["data_parallel"].memory_per_device
    cap = dp_mem * 0.5
    # plain data parallelism (no ZeRO, no recomputation: with them it fits, planning/test_flat_options.py)
    plan = autopar.plan(model, inputs, "8xA100", memory_capacity=device_memory_for(cap), zero=0, recompute=False)
    print(f"data parallel {dp_mem / 2**20:.1f} MiB/device; capacity {cap / 2**20:.1f}; plan {plan.memory_per_device / 2**20:.1f}")
    assert plan.memory_per_device <= cap
    assert plan.baselines["data_parallel"].memory_per_device > cap
    assert any(c.splits[i] > 1 for n, c in plan.assignment.items()
               for i, d in enumerate(plan.graph.node(n).dims) if d.name in ("n", "k") or d.reduction)


def test_infeasible_memory_names_the_smallest_reachable_figure(big_gpt):
    model, inputs = big_gpt
    with pytest.raises(InfeasibleError, match=r"the least autopar can reach is [0-9.]+ GiB per device") as e:
        autopar.plan(model, inputs, "8xA100", memory_capacity=1e6)
    assert e.value.min_memory_per_device > 1e6
    assert "\n" not in str(e.value)


def test_expert_baseline_exists_for_transformers_and_is_no_better_than_autopar():
    model, inputs = autopar.zoo.get("gpt", layers=2, width=512, heads=8, seq=128, device="meta")
    plan = autopar.plan(model, inputs, "8xA100")
    expert = plan.baselines["expert"]
    assert plan.cost <= expert.cost * (1 + 1e-9)
    # the expert splits the block linears' n (column) or k (row) dims over the tensor-parallel axes
    linears = [n for n in plan.graph.nodes if n.op == "linear" and ".fc" in n.module]
    assert linears, "the gpt has block MLP linears"
    for n in linears:
        cfg = expert.assignment[n.name]
        split = {d.name: s for d, s in zip(n.dims, cfg.splits) if s > 1}
        assert any(plan.graph.node(n.name).dim(k).reduction or k == "n" for k in split), (n.module, split)


def test_report_folds_repeated_blocks_and_lists_baselines():
    model, inputs = autopar.zoo.get("gpt", layers=4, device="meta")
    text = autopar.plan(model, inputs, "8xA100").report()
    # block 0 may differ from the others (its first node reshards what the embeddings leave)
    assert re.search(r"^  blocks\.[12]-3: same as blocks\.[01]$", text, flags=re.M), text
    assert "vs data parallel" in text and "vs expert" in text
    assert "blocks.2.fc1" not in text


@pytest.mark.parametrize("kwargs,match", [
    ({"search": "magic"}, "unknown search"),
    ({"cost_model": "oracle"}, "unknown cost model"),
    ({"space": "pase:0"}, "unknown space"),
    ({"cost_model": "pase"}, "goes with space='pase'"),
    ({"memory_capacity": -1}, "memory_capacity .* must be > 0"),
    ({"memory_capacity": 0}, "memory_capacity .* must be > 0"),
    ({"memory_capacity": float("nan")}, "memory_capacity .* must be > 0"),
    ({"time_limit": 0, "search": "ilp"}, "time_limit .* must be > 0"),
    ({"time_limit": -5}, "time_limit .* must be > 0"),
])
def test_bad_arguments_are_value_errors(mlp, kwargs, match):
    with pytest.raises(ValueError, match=match):
        autopar.plan(*mlp, autopar.Cluster(devices=4), **kwargs)


@pytest.fixture(scope="module")
def gpt8():
    model, inputs = autopar.zoo.get("gpt", layers=8, width=1024, heads=16, seq=512, batch=32, vocab=32768,
                                    device="meta")
    return model, inputs, autopar.trace(model, inputs)


def test_pipeline_is_taken_only_when_it_pays(gpt8):
    import dataclasses

    model, inputs, graph = gpt8
    fast = autopar.Cluster.preset("2x8xH100")
    slow = dataclasses.replace(fast, inter_bandwidth=2e8, name="slow-ib")
    # fp32 (the mechanism, not the default precision, is under test: at bf16's 15x the compute
    # rate this model's single-stage plan takes 6 ms and no pipeline beats it)
    for cluster in (fast, slow):
        with_pp = autopar.plan(model, inputs, cluster, graph=graph, pipeline=True, baselines=False, precision="fp32")
        without = autopar.plan(model, inputs, cluster, graph=graph, pipeline=False, baselines=False,
                               precision="fp32")
        assert with_pp.cost <= without.cost * (1 + 1e-12)
        if with_pp.stages:
            assert with_pp.cost < without.cost
            names = [n for s in with_pp.stages for n in s.nodes]
            assert names == [n.name for n in graph.nodes]  # stages cover the graph in order
            assert with_pp.microbatches % len(with_pp.stages) == 0
    # across a slow inter-node link the gradient all-reduce of data parallelism is the bottleneck:
    # a pipeline, which only sends activations across it, must win
    assert autopar.plan(model, inputs, slow, graph=graph, baselines=False, precision="fp32").stages


def test_microbatch_graph_scales_flops_and_batch_axes(gpt8):
    from autopar.core.batch import batch_dims, scale_batch

    _, _, graph = gpt8
    small = scale_batch(graph, 4)
    assert small.flops == pytest.approx(graph.flops / 4, rel=1e-6)
    assert small.param_count == graph.param_count
    b = batch_dims(graph)
    qkv = next(n for n in graph.nodes if n.module.endswith("attn.qkv"))
    assert small.node(qkv.name).dim(b[qkv.name]).size * 4 == qkv.dim(b[qkv.name]).size


def test_repeated_gpt_blocks_dp_fast_paths_keep_the_ilp_optimum():
    # The traced layers of a GPT are identical: the DP reuses their steps and picks among its
    # candidate orders (search/elimination.py). Whatever it picks, the optimum is the ILP's,
    # and the plain path (no reuse, a fixed greedy order) gives the same cost.
    from autopar.search.dp import dp, dp_plan
    from autopar.search.ilp import ilp

    model, inputs = autopar.zoo.get("gpt", layers=3, batch=8, seq=64, width=128, heads=4)
    plan = autopar.plan(model, inputs, "8xA100", pipeline=False)
    t = plan.tables
    chosen = dp_plan(t)
    assert chosen.reused_steps > 0 and chosen.work < chosen.work_without_reuse
    plain = dp(t, order="min_weight", reuse=False)
    assert plan.cost == pytest.approx(plain.cost, rel=1e-12)
    assert plan.cost == pytest.approx(ilp(t).cost, rel=1e-6)
    # the expert baseline is the same exact search over restricted tables
    expert = plan.baselines["expert"]
    assert expert.cost >= plan.cost * (1 - 1e-12)
