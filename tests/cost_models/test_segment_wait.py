"""The wait a collective absorbs grows with the compute since the ranks last met: the spread of the
ranks over a segment, measured on the live group, prices it; checked against a two-process gloo
run with a skew injected on one rank (it sleeps longer), and the walk over a plan's step against
meetings counted by hand on fake timings."""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from autopar.cost_models.profile_cache import Timing
from autopar.cost_models.profiled import CommFit, ProfiledModel
from autopar.cost_models.segment_wait import Spread, segment_waits, spread_line, spread_of
from autopar.cost_models.tables import build_tables

import autopar
from tests.helpers.dist_utils import run_gloo

CPU2 = autopar.Cluster.preset("cpu", devices=2)
SKEW = 0.5  # rank 1's segment sleeps this much longer than rank 0's
SHORT, LONG = 5e-3, 40e-3  # the segments, s (rank 0's)
ROUNDS = 12


def _sleeper(skew: float):
    import torch.distributed as dist

    def segment(seconds: float):
        mine = seconds * (1.0 + skew * dist.get_rank())
        return lambda: time.sleep(mine)
    return segment


def _skewed_rank(rank: int, world: int) -> dict:
    """The spread fitted with and without the injected skew, and with it each rank's time from a
    barrier to the return of an all-reduce that follows the segment (what a step meets)."""
    import torch.distributed as dist
    from autopar.cost_models.segment_wait import spread_points

    out = {f: spread_points("cpu", (SHORT, LONG), ROUNDS, segment=_sleeper(f)) for f in (0.0, SKEW)}
    buf = torch.zeros(1024)
    dist.all_reduce(buf)
    met = {}
    for seconds in (SHORT, LONG):
        seg = _sleeper(SKEW)(seconds)
        rows = []
        for _ in range(ROUNDS):
            dist.barrier()
            t0 = time.perf_counter()
            seg()
            t1 = time.perf_counter()
            dist.all_reduce(buf)
            rows.append((t1 - t0, time.perf_counter() - t0))
        met[seconds] = rows
    out["met"] = met
    return out


@pytest.fixture(scope="module")
def skewed():
    return run_gloo(_skewed_rank, 2)


def test_the_spread_follows_an_injected_skew(skewed):
    even, skew = skewed[0][0.0], skewed[0][SKEW]
    assert skewed[1][SKEW] == skew  # all-gathered: every rank prices alike
    (s0, w0), (s1, w1) = skew
    # rank 1 computes 1.5x rank 0: the slowest is 0.25 S_0 behind the mean of 1.25 S_0
    assert w1 / s1 == pytest.approx(SKEW / 2 / (1 + SKEW / 2), rel=0.35)
    assert w1 > 2 * even[1][1]  # without the skew the ranks stay together
    fit = spread_line(*skew)
    assert fit.power > 0.75  # a skew in proportion to the segment: W linear in S


def test_the_priced_wait_grows_as_a_collective_after_the_segment_waits(skewed):
    """Independent of the fit: the time from the ranks' meeting to the all-reduce's return on
    the later of them, less the ranks' mean segment, is the collective plus the wait; its growth
    from the short to the long segment is what the fitted spread prices."""
    fit = spread_line(*skewed[0][SKEW])
    excess, mean_seg = {}, {}
    for seconds in (SHORT, LONG):
        rounds = list(zip(skewed[0]["met"][seconds], skewed[1]["met"][seconds]))
        # the median round: a collective descheduled on a loaded host is not the wait
        excess[seconds] = statistics.median(max(a[1], b[1]) - (a[0] + b[0]) / 2 for a, b in rounds)
        mean_seg[seconds] = statistics.fmean((a[0] + b[0]) / 2 for a, b in rounds)
    measured = excess[LONG] - excess[SHORT]
    priced = fit(mean_seg[LONG]) - fit(mean_seg[SHORT])
    assert measured > 0 and priced > 0
    assert 0.5 < measured / priced < 2.0


def test_spread_of_is_the_slowest_less_the_mean():
    assert spread_of([[1.0, 2.0], [3.0, 3.0], [1.0, 2.0, 6.0]]) == pytest.approx((0.5 + 0.0 + 3.0) / 3)
    assert Spread(2e-3, 8e-3, 0.5)(2e-3) == pytest.approx(1e-3)
    assert spread_line((1e-3, 1e-4), (4e-3, 4e-3)).power == 1.0  # clamped: never faster than the segment
    assert spread_line((1e-3, 1e-3), (4e-3, 1e-3)).power == 0.5  # nor slower than independent noise


# -- the walk over one plan's step (fake timings: every op 1 ms forward, 2 ms backward) -----------

FAR = CommFit(latency=2e-3, bandwidth=1e9, world=2, gather_latency=3e-3, gather_bandwidth=0.5e9)
NEAR = CommFit(latency=1e-3, bandwidth=1.2e9, world=2, gather_latency=1.5e-3, gather_bandwidth=0.8e9)
K = 0.1  # the fake spread: 10% of the segment


def _model(tmp_path) -> ProfiledModel:
    model = ProfiledModel(cache_path=str(tmp_path / "p.sqlite"), optimizer=None)
    model.comm, model.near, model._comm_done = FAR, NEAR, True
    model.cache.get = lambda device, version, signature: Timing(1e-3, 2e-3)
    model.spread = Spread(K * 32e-3, 32e-3, 1.0)
    return model


def _graph():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    return autopar.trace(model, (torch.randn(8, 64),))


def _plan(graph, tables, choice):
    return {n: tables.configs[i][c] for i, (n, c) in enumerate(zip(tables.nodes, choice))}


def test_a_plan_without_collectives_waits_once_at_the_step_end(tmp_path):
    graph, model = _graph(), _model(tmp_path)
    tables = build_tables(graph, CPU2, model, space="mesh", mode="train", optimizer=None)
    whole = [next(j for j, c in enumerate(cs) if c.devices == 1) for cs in tables.configs]
    got = segment_waits(graph, _plan(graph, tables, whole), model, CPU2)
    assert [m.what for m in got.meetings] == ["step end"]
    assert got.seconds == pytest.approx(K * 3e-3 * len(graph.nodes))  # every op's 1 + 2 ms, one segment


def test_data_parallel_waits_at_the_gradient_sync_beyond_its_fit(tmp_path):
    from autopar.planning.baselines import data_parallel_choice

    graph, model = _graph(), _model(tmp_path)
    tables = build_tables(graph, CPU2, model, space="mesh", mode="train", optimizer=None)
    got = segment_waits(graph, _plan(graph, tables, data_parallel_choice(graph, tables)), model, CPU2)
    sync = [m for m in got.meetings if m.what == "grad-sync"]
    assert len(sync) == 1 and sync[0].segment == pytest.approx(3e-3 * len(graph.nodes))
    # the bucket's fit already holds the wait of its 4 ms gap; nothing runs after it (no update)
    assert got.seconds == pytest.approx(K * (3e-3 * len(graph.nodes) - model.comm_gap))


def test_no_wait_without_a_live_spread(tmp_path):
    graph, model = _graph(), _model(tmp_path)
    model.spread = None
    tables = build_tables(graph, CPU2, model, space="mesh", mode="train", optimizer=None)
    whole = [next(j for j, c in enumerate(cs) if c.devices == 1) for cs in tables.configs]
    assert segment_waits(graph, _plan(graph, tables, whole), model, CPU2).seconds == 0.0
