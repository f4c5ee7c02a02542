"""The floor from the units each rank's memory caps it at (``held_units.capped_floor``,
``space_bound.capped_bound``): against every cut of a few units into the stages of an interleaved
schedule, the slowest rank of the best cut that fits is never faster than the floor; on a chain of
blocks whose interleaved schedules' first ranks hold the most microbatches, the capped bound stays
at most every candidate's best fitting layout at capacities down to the least any layout needs,
and raises the pipeline's floor where the whole-unit floor stays below."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

import autopar
from autopar.core.cluster import Cluster
from autopar.core.margin import usable_memory
from autopar.planning import hierarchical as H
from autopar.planning.held_units import capped_floor, fitting_count, held_floor
from autopar.planning.space_bound import capped_bound, held_bound
from autopar.search.dp import dp
from tests.helpers.layouts import SCHEDULES, priced, window_layouts
from tests.planning.test_space_bound import Chain


def _best_fitting_cut(time, cut, static, acts, held, room, ranks, per_rank) -> float:
    """Every cut of the units into ``ranks x per_rank`` contiguous stages, stage k on rank k mod
    ranks, each stage paying the cut before and after it, rank w holding its units' state and
    ``held[w]`` microbatches of their activations within ``room``: the least slowest rank."""
    n, stages = len(time), ranks * per_rank
    ends = np.concatenate([[0.0], cut, [0.0]])
    best = math.inf
    for inner in itertools.combinations(range(1, n), stages - 1):
        bounds = (0, *inner, n)
        load, memory = np.zeros(ranks), np.zeros(ranks)
        for k in range(stages):
            a, b, w = bounds[k], bounds[k + 1], k % ranks
            load[w] += float(np.sum(time[a:b])) + ends[a] + ends[b]
            memory[w] += float(np.sum(static[a:b])) + held[w] * float(np.sum(acts[a:b]))
        if np.all(memory <= room):
            best = min(best, float(np.max(load)))
    return best


@pytest.mark.parametrize("ranks,per_rank", [(2, 1), (2, 2), (3, 2), (2, 3)])
def test_the_capped_floor_is_below_every_cut_that_fits(ranks, per_rank):
    rng = np.random.default_rng(ranks * 10 + per_rank)
    for _ in range(30):
        n = int(rng.integers(ranks * per_rank, 10))
        time = rng.choice([0.2, 1.0, 1.0, 1.0, 3.0], size=n) * rng.uniform(0.9, 1.1, size=n)
        cut = rng.uniform(0.0, 0.3, size=n - 1)
        static, acts = rng.uniform(0.0, 1.0, size=n), rng.uniform(0.0, 2.0, size=n)
        held = ranks - np.arange(ranks) + (ranks - 1) / per_rank  # interleaved 1F1B's in flight
        room = float(rng.uniform(0.3, 1.0)) * float(np.sum(static + held[0] * acts))
        caps = [fitting_count(static + h * acts, room) for h in held]
        exact = _best_fitting_cut(time, cut, static, acts, held, room, ranks, per_rank)
        assert capped_floor(time, caps, cut, per_rank) <= exact * (1 + 1e-12)


def test_the_first_ranks_memory_puts_more_units_on_the_last():
    """Eight equal units over two ranks of two stages, the first holding 2.5 microbatches, the
    second 1.5, room for 7.5 units' activations: the first fits 3 units, so the second holds 5,
    as the best cut that fits does; the whole-unit floor says 4."""
    time, acts, static, cut = np.ones(8), np.ones(8), np.zeros(8), np.zeros(7)
    held = np.array([2.5, 1.5])
    caps = [fitting_count(static + h * acts, 7.5) for h in held]
    assert caps == [3, 5]
    assert capped_floor(time, caps, cut, 2) == pytest.approx(5.0)
    assert _best_fitting_cut(time, cut, static, acts, held, 7.5, 2, 2) == pytest.approx(5.0)
    assert held_floor(time, cut, 2, 2) == pytest.approx(4.0)
    assert math.isinf(capped_floor(time, [fitting_count(h * acts, 5.0) for h in held], cut, 2))


@pytest.fixture(scope="module")
def chain_layouts():
    """Tensor 2 x pipeline 2 on 4 A100s, every schedule (interleaved 1F1B with 2 and 4 stages per
    rank), every layout of the window (the middle blocks one layout); 256 rows a sequence, so that
    a block's activations outweigh its state and the microbatches a rank holds cap its units."""
    cluster = Cluster.preset("4xA100")
    g = autopar.trace(Chain().to("meta"), (torch.empty(4, 256, 16, device="meta"),))
    search = H.Search(g, cluster, "bf16", "adam", "train", usable_memory(cluster.memory_capacity),
                      lambda t, g=None: dp(t))
    cands = [x for x in search.candidates(None, (0,), (False,), SCHEDULES)
             if x[3].degrees.t == x[3].degrees.p == 2]
    every = window_layouts(search, cands, cluster)
    return search, cluster, cands, every


@pytest.mark.parametrize("share", [1.0, 0.25, 0.1, 0.0])
def test_the_capped_bound_is_below_every_fitting_layout_and_raises_the_bound(chain_layouts, share):
    """At capacities every layout, a quarter, a tenth and only the leanest fit: the capped bound
    (with the optimizer step of perfectly sharded state) is at most each candidate's best fitting
    layout (plain or sequence parallel, as the search prices it); at a tenth and below, the caps
    raise some interleaved candidate's pipeline above the whole-unit floor."""
    search, cluster, cands, every = chain_layouts
    memory = sorted(priced(search, s, c, cluster).memory for s, c in every)
    search.capacity = memory[min(int(len(memory) * share), len(memory) - 1)]
    best: dict = {}
    for s, c in every:
        pr = priced(search, s, c, cluster, fitting=True)
        if pr.fits:
            best[c] = min(best.get(c, math.inf), pr.cost)
    assert best and any(c.virtual > 1 for c in best)
    raised = 0
    for comp, rest, _, c in cands:
        if c in best:
            assert capped_bound(search, c) + rest <= best[c] * (1 + 1e-9), c.describe()
        raised += capped_bound(search, c) > held_bound(search, c) * (1 + 1e-9)
    assert raised > 0 or share > 0.1
