"""ZeRO-3's transient floor (``space_bound.transient_floor``): every layout of a ZeRO-3 candidate
holds whole, beside its shards, the root units' parameters and gradients (the prologue's and the
epilogue's, left to the root module as ``fully_shard`` leaves them) and the two largest blocks'
(``step_price.zero3_held``, what the search prices). Checked against every layout of a tensor
group priced as the search prices a plan, and against every ZeRO-3 candidate a small PaLM's
search prices; the floor is never below the one that took the two largest units, roots or not."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

import autopar
from autopar.core.cluster import Cluster
from autopar.core.margin import usable_memory
from autopar.core.tables import Solution
from autopar.cost_models.training import zero3_gathered
from autopar.planning import hierarchical as H
from autopar.planning.space_bound import any_layout_bound, memory_floor, memory_floors, transient_floor
from autopar.planning.units import unit_stats
from autopar.search.dp import dp
from tests.helpers.layouts import SCHEDULES, Residual, priced

TRANSIENT = "transient (recomputed block, gathered ZeRO-3 parameters)"
FOUR = Cluster.preset("4xA100")  # tensor 2 x data 2: a ZeRO-3 group with several layouts


def _two_largest(search, c) -> float:
    """The floor as it was: the two largest units' least whole bytes, any unit taken as a block."""
    whole = np.asarray([1.0, 1.0, 0.0])
    units = [sum(float(np.min(k @ whole)) for k in u) for u in memory_floors(search, c).state]
    rerun = float(np.max(memory_floors(search, c).rerun)) if c.recompute else 0.0
    return rerun + zero3_gathered(units, [False] * len(units))


@pytest.fixture(scope="module")
def toy_layouts():
    """The residual toy on 4 A100s: per ZeRO-3 candidate of tensor 2 x data 2 (1 or 2
    microbatches, with and without recomputation, every schedule), every layout of its group."""
    g = autopar.trace(Residual().to("meta"), (torch.empty(4, 16, device="meta"),))
    search = H.Search(g, FOUR, "bf16", "adam", "train", usable_memory(FOUR.memory_capacity), lambda t, g=None: dp(t))
    cands = [c for *_, c in search.candidates(None, (3,), (False, True), SCHEDULES) if c.degrees.t == 2 and c.zero]
    groups: dict[tuple, list] = {}
    for c in cands:
        groups.setdefault(search.group_key(c), []).append(c)
    every = []
    for (tensor, micro, rc), members in groups.items():
        sizes = [len(k) for k in search._stats(tensor, micro, rc).tables.configs]
        for choice in itertools.product(*(range(k) for k in sizes)):
            fixed = lambda t, _g=None, ch=list(choice): Solution(ch, 0.0, 0.0, "fixed", 0.0)  # noqa: E731
            s = unit_stats(search.training_graph(rc), search.spans, FOUR, tensor, micro, search.objective, fixed,
                           "train", "adam", search.window(rc))
            every += [(s, c) for c in members]
    return search, cands, every


def test_the_zero3_floor_is_the_least_transient_of_every_layout(toy_layouts):
    """Per ZeRO-3 candidate, the floor is at most the transient every layout is priced with and,
    without recomputation, equal to the least of them: the head (a root unit, whole all step)
    counts beside the two blocks (the floor of the two largest units left it out)."""
    search, cands, every = toy_layouts
    least: dict = {}
    for s, c in every:
        least[c] = min(least.get(c, math.inf), priced(search, s, c, FOUR).memory_terms[TRANSIENT])
    assert len(least) == len(cands) and any(not c.recompute for c in least)
    for c, t in least.items():
        floor = transient_floor(search, c)
        assert floor <= t * (1 + 1e-9), c.describe()
        if not c.recompute:
            assert floor == pytest.approx(t, rel=1e-9), c.describe()
            assert floor > _two_largest(search, c), c.describe()


@pytest.fixture(scope="module")
def palm_priced():
    """A small PaLM (shared input and output embeddings: the prologue and the epilogue both hold
    them, and a mask buffer per block, kept whole and never synced) on 2 x 4 A100: every ZeRO
    candidate of the space, priced as the search prices it."""
    model, inputs = autopar.zoo.get("palm", batch=8, seq=64, width=128, heads=4, head_dim=32, ffn=512, layers=4,
                                    vocab=512, device="meta")
    cluster = Cluster.preset("2x4xA100")
    s = H.Search(autopar.trace(model, inputs), cluster, "bf16", "adam", "train",
                 usable_memory(cluster.memory_capacity), lambda t, g=None: dp(t))
    cands = [x for x in s.candidates(None, (1, 2, 3), (False, True, "attention"), tuple(H.SCHEDULES)) if x[3].zero]
    return s, [(comp, rest, static, c, s.price(c)) for comp, rest, static, c in cands]


def test_the_sync_floor_leaves_out_the_buffers_kept_whole(palm_priced):
    """The bound under any layout is at most the price of every ZeRO 1-3 candidate: the
    data-parallel sync floor gathers the parameters the price gathers, not the per-block mask
    buffers, which every data rank holds whole (a one-layout data-parallel candidate is priced
    exactly, so a floor counting them sits above its price)."""
    search, rows = palm_priced
    assert any(c.degrees.t == c.degrees.p == 1 for *_, c, _ in rows)
    for comp, rest, _, c, pr in rows:
        assert any_layout_bound(search, c, comp, rest) <= pr.cost * (1 + 1e-9), c.describe()


def test_the_zero3_floors_are_below_every_priced_palm_candidate(palm_priced):
    """The transient floor at most the priced transient and the memory floor at most the priced
    peak for every ZeRO-3 candidate (tensor, pipeline, interleaved, recomputed or not); and the
    floor is never below the two largest units' (on this model the root units and two blocks are
    above it)."""
    search, rows = palm_priced
    rows = [r for r in rows if r[3].zero == 3]
    assert any(c.degrees.t > 1 for *_, c, _ in rows) and any(c.degrees.p > 1 for *_, c, _ in rows)
    raised = 0
    for comp, rest, static, c, pr in rows:
        floor = transient_floor(search, c)
        assert floor <= pr.memory_terms[TRANSIENT] * (1 + 1e-9), c.describe()
        assert memory_floor(search, c, static) <= pr.memory * (1 + 1e-9), c.describe()
        old = _two_largest(search, c)
        assert floor >= old * (1 - 1e-12), c.describe()
        raised += floor > old * (1 + 1e-6)
    assert raised == len(rows)
