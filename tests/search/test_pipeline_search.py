"""The pipeline cut DP against brute force over every way to cut a short sequence."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from autopar.search.pipeline import StageCosts, best_cuts, in_flight, search, step_time


def brute(c: StageCosts, stages: int, capacity: float, schedule: str):
    n = len(c.time)
    cut = np.concatenate([[0.0], c.cut_time, [0.0]])
    best = None
    for inner in itertools.combinations(range(1, n), stages - 1):
        edges = (0, *inner, n)
        bounds = list(zip(edges[:-1], edges[1:]))
        mems = [c.static_memory[a:b].sum() + in_flight(schedule, k, stages, c.microbatches)
                * c.activation_memory[a:b].sum() for k, (a, b) in enumerate(bounds)]
        if max(mems) > capacity:
            continue
        times = [c.time[a:b].sum() + cut[a] + cut[b] for a, b in bounds]
        syncs = [c.sync[a:b].sum() for a, b in bounds]
        cost = step_time(times, syncs, c.microbatches)
        bottleneck = max(times)
        if best is None or bottleneck < best[0] - 1e-12:
            best = (bottleneck, cost)
    return best


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 9), st.integers(2, 4), st.integers(1, 8), st.sampled_from(["1f1b", "gpipe"]),
       st.integers(0, 10**6), st.floats(0.3, 3.0))
def test_dp_bottleneck_equals_brute_force(n, stages, micro, schedule, seed, cap_scale):
    rng = np.random.default_rng(seed)
    c = StageCosts(2, micro, rng.random(n), rng.random(n) * 0.1, rng.random(n), rng.random(n),
                   rng.random(n - 1) * 0.5)
    capacity = cap_scale * (c.static_memory.sum() + micro * c.activation_memory.sum()) / stages
    sol = best_cuts(c, stages, capacity, schedule)
    ref = brute(c, stages, capacity, schedule) if stages <= n else None
    if ref is None:
        assert sol is None
        return
    assert sol is not None
    assert max(sol.stage_time) == pytest.approx(ref[0])
    assert max(sol.memory) <= capacity + 1e-9
    assert [a for a, _ in sol.stages][0] == 0 and sol.stages[-1][1] == n
    assert all(b == a2 for (_, b), (a2, _) in zip(sol.stages, sol.stages[1:]))


def test_balanced_cut_of_uniform_layers_and_the_bubble():
    # 8 identical layers on 4 stages: 2 layers each; step = (M + S - 1) * 2 + sync
    c = StageCosts(1, 8, np.ones(8), np.zeros(8), np.zeros(8), np.zeros(8), np.zeros(7))
    sol = best_cuts(c, 4, math.inf, "gpipe")
    assert sol.stages == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert sol.cost == pytest.approx((8 + 4 - 1) * 2.0)


def test_1f1b_holds_fewer_microbatches_and_fits_where_gpipe_does_not():
    c = StageCosts(1, 8, np.ones(4), np.zeros(4), np.zeros(4), np.ones(4), np.zeros(3))
    # 2 stages of 2 layers; gpipe holds 8 microbatches x 2 = 16 bytes; 1f1b stage 0 holds 2 x 2 = 4
    assert best_cuts(c, 2, 10.0, "gpipe") is None
    sol = search([c], total_devices=2, capacity=10.0)
    assert sol.schedule == "1f1b" and max(sol.memory) == pytest.approx(4.0)

