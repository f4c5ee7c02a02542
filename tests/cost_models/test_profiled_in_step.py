"""The profiled model prices what a step meets, not what an op timed alone meets: the whole
model's optimizer update streaming from memory, and the shorter wait before a reshard that
follows a short node. The device is replaced by fakes whose behaviour is known, so the checks
are exact and do not depend on the timings of the host."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from autopar.cost_models.analytic import AnalyticModel
from autopar.cost_models.profile_cache import Timing
from autopar.cost_models.profiled import CommFit, ProfiledModel
from autopar.cost_models.tables import build_tables

import autopar
from autopar.core.tables import Config

CPU2 = autopar.Cluster.preset("cpu", devices=2)
CACHE_ELEMENTS = 1 << 16  # the fake device's cache, in parameter elements


def fake_update(shapes) -> Timing:
    """A device whose update costs 1 ns an element while the whole call's state fits its cache
    and 4 ns once it does not (as AdamW on the benchmark machine: 1.8 vs 3.8 ns)."""
    n = sum(math.prod(s) for s, _ in shapes)
    return Timing((1e-9 if n <= CACHE_ELEMENTS else 4e-9) * n, 0.0)


def _mlp(width: int):
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))
    return autopar.trace(model, (torch.randn(8, width),))


def _replicated_update(model: ProfiledModel, graph) -> float:
    total = 0.0
    for n in graph.nodes:
        whole = Config(tuple(1 for _ in n.dims))
        total += sum(t.seconds for t in model.node_breakdown(n, whole, CPU2).terms if t.kind == "optimizer")
    return total


# a model whose state fits the cache, and one whose nodes fit alone but whose whole state does not
@pytest.mark.parametrize("width", [64, 200])
def test_replicated_update_sums_to_the_whole_model_s_update(tmp_path, monkeypatch, width):
    monkeypatch.setattr(ProfiledModel, "_measure_optimizer", lambda self, shapes: fake_update(shapes))
    monkeypatch.setattr(ProfiledModel, "_measure", lambda self, node, config: Timing(1e-4, 1e-4))
    graph = _mlp(width)
    shapes = [(tuple(p.shape), "float32") for p in
              torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, width)).parameters()]
    truth = fake_update(shapes).forward  # one optimizer over every parameter, as a step runs it
    model = ProfiledModel(cache_path=str(tmp_path / "p.sqlite"), optimizer="adamw", fit_comm=False)
    model.profile(graph, CPU2)
    assert _replicated_update(model, graph) == pytest.approx(truth, rel=1e-6)
    alone = copy.copy(model)  # each node priced as timed alone: right only while it all fits
    alone.update_rate = 0.0
    assert width * width + width <= CACHE_ELEMENTS  # each node alone fits
    fits = 2 * (width * width + width) <= CACHE_ELEMENTS
    assert (_replicated_update(alone, graph) == pytest.approx(truth, rel=1e-6)) == fits


def test_a_shard_is_priced_between_its_own_timing_and_the_whole_rate(tmp_path, monkeypatch):
    monkeypatch.setattr(ProfiledModel, "_measure_optimizer", lambda self, shapes: fake_update(shapes))
    monkeypatch.setattr(ProfiledModel, "_measure", lambda self, node, config: Timing(1e-4, 1e-4))
    graph = _mlp(256)
    model = ProfiledModel(cache_path=str(tmp_path / "p.sqlite"), optimizer="adamw", fit_comm=False)
    model.profile(graph, CPU2)
    assert model.update_rate == pytest.approx(4e-9)
    node = next(n for n in graph.nodes if n.op == "linear")
    out_dim = [d.name for d in node.dims].index(node.params[0].spec.axes[0][0])
    half = Config(tuple(2 if i == out_dim else 1 for i in range(len(node.dims))),
                  tuple((0,) if i == out_dim else () for i in range(len(node.dims))))
    [term] = [t for t in model.node_breakdown(node, half, CPU2).terms if t.kind == "optimizer"]
    assert term.seconds == pytest.approx(4e-9 * (256 * 128 + 128))  # half the weight and bias, streamed


# -- reshards after short and long producers ---------------------------------------------------

FAR = CommFit(latency=2e-3, bandwidth=1e9, world=2, gather_latency=3e-3, gather_bandwidth=0.5e9)
NEAR = CommFit(latency=1e-3, bandwidth=1.2e9, world=2, gather_latency=1.5e-3, gather_bandwidth=0.8e9)


def _fitted(tmp_path, forward: float, backward: float | None = None) -> ProfiledModel:
    model = ProfiledModel(cache_path=str(tmp_path / "p.sqlite"), optimizer=None)
    model.comm, model.near, model._comm_done = FAR, NEAR, True
    timed = Timing(forward, forward if backward is None else backward)
    model.cache.get = lambda device, version, signature: timed  # every op, as profiled
    return model


def _analytic_on(fit: CommFit, graph, cluster, mode="train"):
    linked = ProfiledModel._with_links(cluster, fit)
    return build_tables(graph, linked, AnalyticModel(optimizer=None), space="mesh", mode=mode,
                        optimizer=None)


@pytest.mark.parametrize("forward, weight", [(0.5e-3, 0.0), (1e-3, 0.0), (2.5e-3, 0.5), (4e-3, 1.0), (9e-3, 1.0)])
def test_reshard_priced_between_the_two_fits_by_the_producer_s_compute(tmp_path, forward, weight):
    graph = _mlp(64)
    model = _fitted(tmp_path, forward)
    tables = build_tables(graph, CPU2, model, space="mesh", mode="train", optimizer=None)
    far, near = _analytic_on(FAR, graph, CPU2), _analytic_on(NEAR, graph, CPU2)
    moved = 0
    for key, m in tables.edge_cost.items():
        expect = near.edge_cost[key] + weight * (far.edge_cost[key] - near.edge_cost[key])
        np.testing.assert_allclose(m, expect, rtol=1e-9, atol=1e-15)
        moved += int((far.edge_cost[key] != near.edge_cost[key]).any())
    assert moved > 0  # the fits disagree on some edge, so the weight was exercised


def test_forward_move_by_the_producer_gradient_move_by_the_consumer(tmp_path):
    graph = _mlp(64)
    model = _fitted(tmp_path, forward=0.5e-3, backward=9e-3)  # every forward short, every backward long
    tables = build_tables(graph, CPU2, model, space="mesh", mode="train", optimizer=None)
    far, far_fwd = _analytic_on(FAR, graph, CPU2), _analytic_on(FAR, graph, CPU2, "inference")
    near_fwd = _analytic_on(NEAR, graph, CPU2, "inference")
    for key, m in tables.edge_cost.items():  # the forward's move on the near fit, the gradient's on the far
        expect = near_fwd.edge_cost[key] + (far.edge_cost[key] - far_fwd.edge_cost[key])
        np.testing.assert_allclose(m, expect, rtol=1e-9, atol=1e-15)
    inference = build_tables(graph, CPU2, model, space="mesh", mode="inference", optimizer=None)
    for key, m in inference.edge_cost.items():
        np.testing.assert_allclose(m, near_fwd.edge_cost[key], rtol=1e-9, atol=1e-15)


def test_one_fit_when_near_gap_is_off(tmp_path):
    graph = _mlp(64)
    model = _fitted(tmp_path, 0.1e-3)
    model.near_gap, model.near = None, None
    tables = build_tables(graph, CPU2, model, space="mesh", mode="train", optimizer=None)
    far = _analytic_on(FAR, graph, CPU2)
    for key, m in tables.edge_cost.items():
        np.testing.assert_allclose(m, far.edge_cost[key], rtol=1e-9, atol=1e-15)


def test_pricing_the_edges_runs_no_op_the_profile_left_unmeasured(tmp_path):
    graph = _mlp(64)
    model = ProfiledModel(cache_path=str(tmp_path / "p.sqlite"), optimizer=None, max_estimate=0.0)
    model.comm, model.near, model._comm_done = FAR, NEAR, True
    model.profile(graph, CPU2)
    tables = build_tables(graph, CPU2, model, space="mesh", mode="train", optimizer=None)
    assert model.measurements == 0  # every op over max_estimate: analytic, and never run for a weight
    far = _analytic_on(FAR, graph, CPU2)
    for key, m in tables.edge_cost.items():  # no timing: priced on the far fit
        np.testing.assert_allclose(m, far.edge_cost[key], rtol=1e-9, atol=1e-15)


def test_the_whole_update_is_timed_on_at_most_the_cap(tmp_path, monkeypatch):
    from autopar.cost_models import update_timing

    seen = []
    monkeypatch.setattr(update_timing, "UPDATE_RATE_ELEMENTS", 3000)
    monkeypatch.setattr(ProfiledModel, "_measure_optimizer",
                        lambda self, shapes: (seen.append(shapes), fake_update(shapes))[1])
    monkeypatch.setattr(ProfiledModel, "_measure", lambda self, node, config: Timing(1e-4, 1e-4))
    model = ProfiledModel(cache_path=str(tmp_path / "p.sqlite"), optimizer="adamw", fit_comm=False)
    model.profile(_mlp(64), CPU2)  # two 64x64 weights (4096 elements each) and two biases
    whole = [s for s in seen if sum(math.prod(x) for x, _ in s) == 3000]
    assert len(whole) == 1 and whole[0] == [((3000,), "float32")]  # a flat piece of the largest
    assert model.update_rate == pytest.approx(1e-9)  # the fake's rate for 3000 elements


def test_compute_share_times_measured_compute_updates_and_gaps(tmp_path, monkeypatch):
    monkeypatch.setattr(ProfiledModel, "_measure_optimizer", lambda self, shapes: fake_update(shapes))
    monkeypatch.setattr(ProfiledModel, "_measure", lambda self, node, config: Timing(2e-3, 3e-3))
    graph = _mlp(64)
    node = next(n for n in graph.nodes if n.op == "linear")
    whole = Config(tuple(1 for _ in node.dims))
    model = ProfiledModel(cache_path=str(tmp_path / "p.sqlite"), optimizer="adamw", fit_comm=False)
    model.profile(graph, CPU2)
    alone = {t.label: t.seconds for t in model.node_breakdown(node, whole, CPU2).terms}
    assert model.share == 1.0  # no process group: a device's own speed
    model.share = 2.0  # two ranks on each core
    shared = {t.label: t.seconds for t in model.node_breakdown(node, whole, CPU2).terms}
    for label in ("compute forward (measured)", "compute backward (measured)", "optimizer step (measured)"):
        assert shared[label] == pytest.approx(2.0 * alone[label])
    # a 2 ms forward computed at half speed is a 4 ms gap before the reshard: the far fit
    assert model.near_weight(node, [whole], CPU2)[0] == 1.0
    model.share = 1.0
    assert model.near_weight(node, [whole], CPU2)[0] == pytest.approx(1 / 3)


# -- the run's compute scale: the model's own ops re-timed by the ranks ------------------------

PROFILED = (1e-3, 2e-3)  # forward, backward of every op as the profile timed it


def _ranked_slowdown(rank: int) -> float:
    return {0: 1.5, 1: 3.0}[rank]  # the ranks compute 1.5x and 3x slower than the profile timed


def _ranked_update_slowdown(rank: int) -> float:
    return {0: 2.0, 1: 1.25}[rank]  # and update 2x and 1.25x slower: the memory bus shared


def test_the_ranks_retime_the_models_ops_and_price_at_the_slowest_ranks_speed(tmp_path, monkeypatch):
    """A host that runs the ranks' ops slower than the profile did (their cores shared, other
    tenants) prices every measured compute term at the slowest rank's speed, as the step waits
    for it, and every update term at the slowest rank's update speed, re-timed apart (the update
    streams from memory, which the ranks share); a matmul segment timed alone and together
    (``compute_share``) does not see either (here: 1.0)."""
    import torch.distributed as dist

    import autopar.cost_models.profiled as profiled
    from tests.helpers.dist_utils import run_threaded

    monkeypatch.setattr(ProfiledModel, "_measure_optimizer", lambda self, shapes: fake_update(shapes))
    monkeypatch.setattr(ProfiledModel, "_measure", lambda self, node, config: Timing(*PROFILED))
    graph = _mlp(64)
    cache = str(tmp_path / "p.sqlite")
    ProfiledModel(cache_path=cache, optimizer="adamw", fit_comm=False).profile(graph, CPU2)  # alone, no group
    node = next(n for n in graph.nodes if n.op == "linear")
    whole = Config(tuple(1 for _ in node.dims))
    alone = {t.label: t.seconds for t in ProfiledModel(cache_path=cache, optimizer="adamw", fit_comm=False)
             .node_breakdown(node, whole, CPU2).terms}

    monkeypatch.setattr(profiled, "fit_collectives", lambda **kw: CommFit(latency=1e-5, bandwidth=1e9, world=2))
    monkeypatch.setattr(profiled, "fit_moves", lambda probe, device: None)
    monkeypatch.setattr(profiled, "compute_share", lambda device="cpu": 1.0)
    import autopar.cost_models.op_runner as op_runner

    timed = []

    def slower(call, backward=True, repeats=5, warmup=2, device="cpu", now=None):
        k = _ranked_slowdown(dist.get_rank())
        timed.append(call)
        return k * PROFILED[0], k * PROFILED[1]

    def update(name, shapes, repeats=5, warmup=2, device="cpu", evict=None, now=None, sync=None):
        # the ranks' readings meet each other's updates: each timed update starts at a barrier
        assert sync is dist.barrier
        n = sum(math.prod(s) for s, _ in shapes)  # an update of one scalar: nothing beyond it here
        return 0.0 if n == 1 else _ranked_update_slowdown(dist.get_rank()) * fake_update(shapes).forward

    monkeypatch.setattr(op_runner, "build", lambda node, config, device: node.name)
    monkeypatch.setattr(op_runner, "time_op", slower)
    monkeypatch.setattr(op_runner, "time_optimizer", update)

    def rank(r, world):
        model = ProfiledModel(cache_path=cache, optimizer="adamw")
        assert model.profile(graph, CPU2) == 0  # every op cached: nothing measured afresh
        terms = {t.label: t.seconds for t in model.node_breakdown(node, whole, CPU2).terms}
        return model.share, model.update_share, terms

    for share, update_share, terms in run_threaded(rank, 2):
        assert share == pytest.approx(3.0)  # the slower rank's, on both
        assert update_share == pytest.approx(2.0)  # the slower rank's update, on both
        for label in ("compute forward (measured)", "compute backward (measured)"):
            assert terms[label] == pytest.approx(3.0 * alone[label])
        assert terms["optimizer step (measured)"] == pytest.approx(2.0 * alone["optimizer step (measured)"])
    # each op signature re-timed once per rank in each of the readings: the first linear reads the
    # data batch, which takes no gradient, so its signature is its own; with the ReLU and the
    # second linear, three thirds of the fake's compute, all needed to cover 90%
    from autopar.cost_models.run_share import READINGS

    names = [n.name for n in graph.nodes]
    assert len(names) == 3 and all(timed.count(name) == 2 * READINGS for name in names)
    assert len(timed) == 6 * READINGS
