"""The hierarchical search: its space, its exactness over that space, its bound against the flat
exact DP, the window that solves repeated blocks once, and the plan it returns."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import autopar
from autopar.core.blocks import apply_training, block_window, units
from autopar.core.cluster import Cluster
from autopar.core.strategy import TrainingOptions
from autopar.cost_models.analytic import AnalyticModel
from autopar.planning import hierarchical as H
from autopar.planning.degrees import level_degrees, parse_pin, triples
from autopar.planning.units import unit_stats
from autopar.search.dp import dp

# two nodes of four devices with a slow link between them, small memory so that memory matters
CLUSTER = dataclasses.replace(Cluster.preset("2x4xA100"), inter_bandwidth=5e9, name="2x4 slow")


def small_gpt(layers=4, batch=16):
    model, inputs = autopar.zoo.get("gpt", layers=layers, width=64, heads=4, seq=32, batch=batch, vocab=256,
                                    device="meta")
    return model, inputs, autopar.trace(model, inputs)


def test_degrees_multiply_to_each_level_and_cross_node_tensor_groups_take_whole_nodes():
    assert sorted(triples(4)) == sorted({(a, b, 4 // (a * b)) for a in (1, 2, 4) for b in (1, 2, 4) if 4 % (a * b) == 0})
    degs = level_degrees([4, 6], max_tensor=64)
    assert all(d.tensor[l] * d.pipeline[l] * d.data[l] == size for d in degs for l, size in enumerate([4, 6]))
    assert all(d.tensor[0] == 4 for d in degs if d.tensor[1] > 1)
    assert all(d.tensor[2] == 1 for d in level_degrees([2, 2, 2]))  # no tensor parallelism across pods
    assert all(d.t <= 8 for d in level_degrees([8, 8], max_tensor=8))


def test_the_automatic_rule():
    assert not H.use_hierarchical(Cluster(devices=64))
    assert H.use_hierarchical(Cluster(devices=128))
    pods = Cluster(devices=16, devices_per_node=4, nodes_per_pod=2)
    assert pods.pods == 2 and pods.levels() == [4, 2, 2] and H.use_hierarchical(pods)
    assert pods.link(2) == (pods.inter_bandwidth, pods.inter_latency)  # no pod figure: the inter-node one


def test_pins_parse_and_refuse_bad_keys():
    pin = parse_pin("tensor=8,pipeline=64 data=6,recompute=1")
    assert (pin.tensor, pin.pipeline, pin.data, pin.recompute) == (8, 64, 6, True)
    with pytest.raises(ValueError, match="key=value"):
        parse_pin("tensors=8")
    with pytest.raises(ValueError, match="not a number"):
        parse_pin("tensor=eight")


def test_window_stands_for_the_whole_graph():
    """The 3-block window's unit figures, spread over all blocks, equal solving the whole graph
    (here every middle block takes the same layout, as the window assumes)."""
    _, _, g = small_gpt(layers=6)
    g = apply_training(g, TrainingOptions(precision="bf16", recompute=True))
    spans = units(g)
    model = AnalyticModel(sync_scale=0.0)
    solve = lambda t, g=None: dp(t)  # noqa: E731
    full = unit_stats(g, spans, CLUSTER, (4, 1), 2, model, solve)
    win = unit_stats(g, spans, CLUSTER, (4, 1), 2, model, solve, window=block_window(g))
    assert len(block_window(g).graph.nodes) < len(g.nodes)
    for f in ("compute", "comm", "sync", "params", "grads", "optimizer", "acts", "full_acts", "numel", "boundary"):
        np.testing.assert_allclose(getattr(win, f), getattr(full, f), rtol=1e-9, err_msg=f)


def test_branch_and_bound_is_exact_over_its_space():
    """Every candidate of the space priced (no bounds) gives the same best fitting cost as the
    search that prunes with its bounds; with memory tight enough that some do not fit."""
    _, _, g = small_gpt(layers=4, batch=16)
    for capacity in (CLUSTER.memory_capacity, 3.0e6):
        s = H.Search(g, CLUSTER, "bf16", "adam", "train", capacity, lambda t, g=None: dp(t))
        best, _, priced, closed = s.best(None, (0, 1, 3), (False, True))
        everything = [s.price(c) for _, _, mem, c in s.candidates(None, (0, 1, 3), (False, True))]
        fitting = [p.cost for p in everything if p.fits]
        assert closed and priced < len(everything)
        if fitting:
            assert best.cost == pytest.approx(min(fitting), rel=1e-12)
        else:
            assert best is None


@pytest.mark.parametrize("cluster", [Cluster(devices=8), CLUSTER], ids=["one node of 8", "2 nodes of 4"])
def test_the_stated_bound_is_over_the_space_and_above_the_compute_bound_of_any_plan(cluster):
    """The gap is against the optimum of the hierarchical space (docs/bound.md; brute-forced in
    test_space_bound.py), a bound at least as high as the compute bound of *any* plan (every FLOP
    at peak x efficiency on every device), which the flat exact optimum, another space, respects
    too; the hierarchical plan is no better than that bound either."""
    model, inputs, g = small_gpt(layers=4, batch=16)
    flat = autopar.plan(model, inputs, cluster, graph=g, hierarchical=False, pipeline=False, baselines=False,
                        precision="fp32", zero=0, recompute=False)
    assert flat.search.status == "optimal"
    hier = autopar.plan(model, inputs, cluster, graph=g, hierarchical=True, precision="fp32", zero=0,
                        recompute=False, baselines=False)
    assert hier.search.status == "bound" and hier.search.gap >= 0
    bound = hier.cost / (1 + hier.search.gap)
    st = hier.strategy
    any_plan = st.model_flops / (cluster.devices * st.peak_flops * AnalyticModel().efficiency(cluster))
    assert bound >= any_plan * (1 - 1e-9) and flat.cost >= any_plan * (1 - 1e-9)
    assert hier.search.gap < hier.cost / any_plan - 1  # tighter than the compute bound


def test_plan_pinned_published_and_data_parallel_baselines_round_trip(tmp_path):
    model, inputs, g = small_gpt(layers=4, batch=128)
    big = Cluster.preset("16x8xA100")  # 128 devices: the rule picks the hierarchical search
    plan = autopar.plan(model, inputs, big, graph=g, pin="tensor=4,pipeline=2,data=16,recompute=0")
    assert plan.space == "hierarchical" and plan.search.name == "hierarchical"
    assert set(plan.baselines) == {"data_parallel", "published"}
    pub = plan.baselines["published"]
    assert (pub.strategy.degrees.t, pub.strategy.degrees.p, pub.strategy.degrees.d) == (4, 2, 16)
    for b in plan.baselines.values():  # the pinned space is part of autopar's
        assert plan.cost <= b.cost * (1 + 1e-12) or b.memory_per_device > big.memory_capacity
    deg = plan.strategy.degrees
    assert deg.devices == 128 and plan.mesh.size == 128
    # every node's config splits its batch over the data degree (at least)
    from autopar.core.batch import batch_dims

    batch = batch_dims(g)
    for node in g.nodes:
        b = batch.get(node.name)
        if b is not None:
            k = [d.name for d in node.dims].index(b)
            assert plan.assignment[node.name].splits[k] % deg.d == 0
    path = tmp_path / "plan.json"
    plan.save(path)
    back = autopar.Plan.load(path)
    assert back.strategy.degrees == deg and back.strategy.options == plan.strategy.options
    assert back.report() == plan.report()
    text = plan.report()
    assert "why autopar's plan differs from published" in text and "MFU" in text


def test_nothing_fits_is_one_clear_error():
    model, inputs, g = small_gpt(layers=4, batch=16)
    with pytest.raises(autopar.InfeasibleError, match="hierarchical space fits"):
        autopar.plan(model, inputs, CLUSTER, graph=g, hierarchical=True, memory_capacity=1e4, baselines=False)


def test_mfu_counts_three_forwards_at_the_compute_dtype_peak():
    model, inputs, g = small_gpt(layers=4, batch=16)
    plan = autopar.plan(model, inputs, CLUSTER, graph=g, hierarchical=True, precision="bf16", baselines=False)
    s = plan.strategy
    assert s.model_flops == pytest.approx(3 * g.flops)
    assert s.peak_flops == CLUSTER.peak("bfloat16")
    assert s.mfu(plan.cost, 8) == pytest.approx(3 * g.flops / (plan.cost * 8 * 312e12))
    assert math.isclose(sum(s.time_terms.values()), plan.cost, rel_tol=1e-9)
