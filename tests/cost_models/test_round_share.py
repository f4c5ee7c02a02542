"""The run's compute scale read beside the steps it prices: a host whose speed changes after the
live fit (the ranks' single reading, ``run_share``) is read again in every round of a
benchmark's steps (``RoundShare``), and the plans are priced at the rounds' median. The device is
a fake whose ranks run at known speeds, fit and rounds apart, so the checks are exact."""

from __future__ import annotations

import statistics

import pytest
from autopar.cost_models.profile_cache import Timing
from autopar.cost_models.profiled import CommFit, ProfiledModel
from autopar.cost_models.run_share import RoundShare, median_share
from autopar.cost_models.tables import build_tables

from tests.cost_models.test_profiled_in_step import CPU2, PROFILED, _mlp, fake_update

# each rank's speed against the profile: 1.0 at the fit, then per round (the host got busier)
AT_FIT = {0: 1.0, 1: 1.0}
ROUNDS = {0: [1.2, 1.5, 1.1, 1.4, 1.3], 1: [1.0, 1.6, 1.3, 1.2, 1.25]}
SLOWEST = [max(a, b) for a, b in zip(ROUNDS[0], ROUNDS[1])]  # a step waits for the slower rank


@pytest.fixture
def profiled_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(ProfiledModel, "_measure_optimizer", lambda self, shapes: fake_update(shapes))
    monkeypatch.setattr(ProfiledModel, "_measure", lambda self, node, config: Timing(*PROFILED))
    graph = _mlp(64)
    cache = str(tmp_path / "p.sqlite")
    ProfiledModel(cache_path=cache, optimizer="adamw", fit_comm=False).profile(graph, CPU2)  # alone, no group
    return graph, cache


def test_the_rounds_reading_follows_a_host_that_slows_after_the_fit(profiled_cache, monkeypatch):
    import torch.distributed as dist

    import autopar.cost_models.op_runner as op_runner
    import autopar.cost_models.profiled as profiled
    from tests.helpers.dist_utils import run_threaded

    graph, cache = profiled_cache
    monkeypatch.setattr(profiled, "fit_collectives", lambda **kw: CommFit(latency=1e-5, bandwidth=1e9, world=2))
    monkeypatch.setattr(profiled, "fit_moves", lambda probe, device: None)
    monkeypatch.setattr(profiled, "compute_share", lambda device="cpu": 1.0)
    speed = dict(AT_FIT)  # rank -> its speed now, set by the rank before each reading

    def timed(call, backward=True, repeats=5, warmup=2, device="cpu", now=None):
        k = speed[dist.get_rank()]
        return k * PROFILED[0], k * PROFILED[1]

    monkeypatch.setattr(op_runner, "build", lambda node, config, device: node.name)
    monkeypatch.setattr(op_runner, "time_op", timed)

    def rank(r, world):
        model = ProfiledModel(cache_path=cache, optimizer="adamw")
        assert model.profile(graph, CPU2) == 0  # every op cached
        model.comm_cluster(CPU2)  # the live fit, with its single reading
        reader = RoundShare.of(model)
        for k in ROUNDS[r]:
            speed[r] = k
            dist.barrier()  # as the benchmark's rounds meet before each item
            reader.read()
        return model.share, reader.slowest(), reader.share(), reader.share(skip=1)

    for fit, rounds, share, skipped in run_threaded(rank, 2):
        assert fit == pytest.approx(1.0)  # the fit's reading saw the host as it was then
        assert rounds == pytest.approx(SLOWEST)  # each round's slower rank
        assert share == pytest.approx(statistics.median(SLOWEST))  # 1.3: what the steps ran at
        assert skipped == pytest.approx(statistics.median(SLOWEST[1:]))  # warm-up rounds left out


def test_no_reading_leaves_the_share_unset():
    assert median_share([]) is None
    assert median_share([0.0, float("nan")]) is None  # rounds whose ops could not be re-timed
    assert median_share([0.0, 2.0, 1.0, 3.0]) == 2.0


def test_the_benchmark_prices_every_plan_at_the_rounds_share(profiled_cache):
    """``benchmarks.cost_vs_measured.price`` on tables rebuilt after the share changed: the
    replicated plan's measured terms (compute and update; it has no collective) scale with it."""
    from benchmarks.cost_vs_measured import price

    graph, cache = profiled_cache
    model = ProfiledModel(cache_path=cache, optimizer="adamw", fit_comm=False)
    model.profile(graph, CPU2)
    whole = {"replicated": None}
    got = {}
    for share in (1.0, 1.3):
        model.share = share
        tables = build_tables(graph, CPU2, model, space="mesh", mode="train", optimizer="adam")
        whole["replicated"] = [next(j for j, c in enumerate(cs) if c.devices == 1) for cs in tables.configs]
        got[share] = price(graph, CPU2, model, tables, whole)["replicated"]
    # the fake profile: each of the three nodes (linear, ReLU, linear) 1 ms forward, 2 ms backward
    assert [n.op for n in graph.nodes] == ["linear", "elementwise", "linear"]
    assert got[1.0]["breakdown"]["compute"] == pytest.approx(3 * sum(PROFILED))
    assert got[1.3]["breakdown"]["compute"] == pytest.approx(1.3 * 3 * sum(PROFILED))
    for key in ("compute", "optimizer"):
        assert got[1.3]["breakdown"][key] == pytest.approx(1.3 * got[1.0]["breakdown"][key])
    assert got[1.3]["before"] == pytest.approx(1.3 * got[1.0]["before"])


def test_the_fits_scale_is_the_median_of_several_readings_of_the_slower_rank(profiled_cache, monkeypatch):
    """One reading that caught the host in a stall does not price the run: ``run_share`` takes
    the median over its readings of each reading's slower rank."""
    import torch.distributed as dist

    import autopar.cost_models.run_share as rs
    from tests.helpers.dist_utils import run_threaded

    graph, cache = profiled_cache
    model = ProfiledModel(cache_path=cache, optimizer="adamw", fit_comm=False)
    model.profile(graph, CPU2)
    per_rank = {0: [1.0, 1.5, 1.0, 1.1, 0.9], 1: [1.05, 1.0, 1.2, 1.0, 1.0]}  # speed per reading
    slowest = [max(a, b) for a, b in zip(per_rank[0], per_rank[1])]  # 1.05 1.5 1.2 1.1 1.0
    assert rs.READINGS == len(slowest)
    calls = {0: 0, 1: 0}

    def retimed(model, picked, *args, **kwargs):
        r = dist.get_rank()
        k = per_rank[r][calls[r]]
        calls[r] += 1
        return k * rs.picked_ops(model, model._reference)[1]

    monkeypatch.setattr(rs, "_retimed", retimed)

    def rank(r, world):
        return rs.run_share(model, model._reference)

    for share in run_threaded(rank, 2):
        assert share == pytest.approx(statistics.median(slowest))  # 1.1, not the first 1.05 nor the mean 1.17
