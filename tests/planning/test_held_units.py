"""The floor from whole units (planning/held_units.py) against every cut of a few units into the
stages of every schedule: the slowest rank of the best cut is never faster than the floor; and
the least over the cuts of the largest stage plus its own offset (planning/sync_cut.py, what the
ranks' syncs bound) against every cut."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from autopar.planning.held_units import held_floor, most_held
from autopar.planning.sync_cut import offset_cut


def _slowest_of_best_cut(time: np.ndarray, cut: np.ndarray, ranks: int, per_rank: int) -> float:
    """Every cut of the units into ``ranks x per_rank`` contiguous stages, stage k on rank
    k mod ranks, each stage paying the cut before and after it: the least slowest rank."""
    n, stages = len(time), ranks * per_rank
    ends = np.concatenate([[0.0], cut, [0.0]])
    best = np.inf
    for inner in itertools.combinations(range(1, n), stages - 1):
        bounds = (0, *inner, n)
        load = np.zeros(ranks)
        for k in range(stages):
            a, b = bounds[k], bounds[k + 1]
            load[k % ranks] += float(np.sum(time[a:b])) + ends[a] + ends[b]
        best = min(best, float(np.max(load)))
    return best


@pytest.mark.parametrize("ranks,per_rank", [(1, 1), (2, 1), (3, 1), (2, 2), (3, 2), (2, 3)])
def test_the_floor_is_below_every_cut(ranks, per_rank):
    rng = np.random.default_rng(ranks * 10 + per_rank)
    for _ in range(20):
        n = int(rng.integers(ranks * per_rank, 9))
        time = rng.choice([0.2, 1.0, 1.0, 1.0, 3.0], size=n) * rng.uniform(0.9, 1.1, size=n)
        cut = rng.uniform(0.0, 0.3, size=n - 1)
        exact = _slowest_of_best_cut(time, cut, ranks, per_rank)
        assert held_floor(time, cut, ranks, per_rank) <= exact * (1 + 1e-12)


def test_whole_units_put_more_on_one_rank_than_the_average():
    """Five equal blocks over two ranks: one holds three, not 2.5; the balanced floor says 2.5."""
    time = np.ones(5)
    assert most_held(time, 2) == pytest.approx(3.0)
    assert _slowest_of_best_cut(time, np.zeros(4), 2, 1) == pytest.approx(3.0)
    assert float(np.sum(time)) / 2 < most_held(time, 2)
    # a light prologue and epilogue beside three blocks: two blocks on one of two ranks
    assert most_held(np.array([0.1, 1.0, 1.0, 1.0, 0.1]), 2) == pytest.approx(2.0)


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_the_offset_cut_is_the_least_over_every_cut(stages):
    """Exact: equal to the least over every cut, not only at most it (the ranks' sync floor is
    this value, so a larger one would not bound the step)."""
    rng = np.random.default_rng(stages)
    for _ in range(20):
        n = int(rng.integers(stages, 8))
        weight = rng.uniform(0.0, 2.0, size=n)
        offsets = np.sort(rng.uniform(0.0, 1.5, size=stages))[::-1]
        exact = min(max(float(np.sum(weight[a:b])) + offsets[k] for k, (a, b) in enumerate(zip((0, *inner), (*inner, n))))
                    for inner in itertools.combinations(range(1, n), stages - 1))
        assert offset_cut(weight, offsets) == pytest.approx(exact, rel=1e-12)
