"""The hierarchical plan's gap is against the optimum of its space (docs/bound.md): on a graph
small enough to price every candidate under every layout of its tensor group, the stated lower
bound is never above that brute-force optimum, the plan never below it, and the gap the plan
reports is the distance between the two it states."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn as nn

import autopar
from autopar.core.cluster import Cluster
from autopar.core.margin import device_memory_for, usable_memory
from autopar.core.tables import Solution
from autopar.planning import hierarchical as H
from autopar.planning.lagrangian import lagrangian_bound
from autopar.planning.space_bound import any_layout_bound, memory_floor, memory_floors, unit_floors
from autopar.planning.step_bounds import sync_lb
from autopar.planning.units import unit_stats
from autopar.search.dp import dp
from tests.helpers.layouts import (CLUSTER, SCHEDULES, ZEROS, Residual, best_fitting, every_layout, priced,
                                   window_layouts)

@pytest.fixture(scope="module")
def toy():
    model = Residual().to("meta")
    inputs = (torch.empty(2, 16, device="meta"),)
    return model, inputs, autopar.trace(model, inputs)


def brute_force(search: H.Search) -> list:
    """Every candidate of the space priced under every layout of its tensor group (each node any
    config of the group's space, no search), as ``step_price.price`` prices a plan."""
    groups: dict[tuple, list] = {}
    for _, _, _, c in search.candidates(None, ZEROS, (False,), SCHEDULES):
        groups.setdefault((search._tensor(c), c.degrees.d * c.microbatches), []).append(c)
    out = []
    graph = search.training_graph(False)
    for (tensor, micro), cands in groups.items():
        sizes = [len(k) for k in search._stats(tensor, micro, False).tables.configs]
        for choice in itertools.product(*(range(k) for k in sizes)):
            fixed = lambda t, _g=None, ch=list(choice): Solution(ch, 0.0, 0.0, "fixed", 0.0)  # noqa: E731
            s = unit_stats(graph, search.spans, CLUSTER, tensor, micro, search.objective, fixed, "train", "adam")
            out += [priced(search, s, c) for c in cands]
    return out


@pytest.fixture(scope="module")
def roomy(toy):
    _, _, g = toy
    s = H.Search(g, CLUSTER, "bf16", "adam", "train", usable_memory(CLUSTER.memory_capacity), lambda t, g=None: dp(t))
    return s, brute_force(s)


def _plan(toy, capacity=None):
    model, inputs, g = toy
    device = None if capacity is None else device_memory_for(capacity)
    return autopar.plan(model, inputs, CLUSTER, graph=g, hierarchical=True, precision="bf16", recompute=False,
                        memory_capacity=device, baselines=False)


def test_without_memory_pressure_the_bound_certifies_the_optimum(toy, roomy):
    """Every layout priced: the plan is the optimum of the space, and the bound closes on it (the
    compute bound of any plan, what the gap was once measured against, is far below it)."""
    _, every = roomy
    optimum = min(p.cost for p in every if p.fits)
    plan = _plan(toy)
    assert plan.cost == pytest.approx(optimum, rel=1e-12)
    assert plan.search.status == "bound" and plan.search.gap <= 1e-9
    assert "best plan of that space" in plan.search.detail


def test_under_memory_pressure_bound_optimum_and_plan_are_in_order(toy, roomy):
    """A capacity a third of the layouts fit: the bound the plan states, cost / (1 + gap), is at
    most the brute-force optimum, which is at most the plan."""
    search, every = roomy
    capacity = sorted(p.memory for p in every)[len(every) // 3]
    search.capacity = capacity
    every = brute_force(search)
    fitting = [p.cost for p in every if p.fits]
    assert fitting and len(fitting) < len(every)
    optimum = min(fitting)
    plan = _plan(toy, capacity)
    assert plan.memory_per_device <= capacity
    bound = plan.cost / (1 + plan.search.gap)
    assert bound <= optimum * (1 + 1e-9)
    assert optimum <= plan.cost * (1 + 1e-12)
    best, _, _, closed = search.best(None, ZEROS, (False,), schedules=SCHEDULES)
    assert closed and best.cost == pytest.approx(plan.cost, rel=1e-12)
    assert search.space_bound == pytest.approx(bound, rel=1e-9)


def test_every_candidates_first_bound_is_below_its_price(toy):
    """The compute bound counts the recomputed forward of the blocks only (the head and the
    embedding are not run again): with recomputation too, no candidate is priced below it."""
    _, _, g = toy
    s = H.Search(g, CLUSTER, "bf16", "adam", "train", usable_memory(CLUSTER.memory_capacity), lambda t, g=None: dp(t))
    for comp, rest, _, c in s.candidates(None, ZEROS, (False, True), SCHEDULES):
        assert comp + rest <= s.price(c).cost * (1 + 1e-9), c.describe()


# -- every bound term against every layout, per candidate ------------------------------------------

@pytest.fixture(scope="module")
def layouts():
    """With and without recomputation: per candidate, every layout of its tensor group as
    ``(UnitStats, candidate)`` (priced again for each capacity)."""
    return every_layout((False, True))


def _price(search, s, c):
    return priced(search, s, c)


def test_unit_floors_hold_for_every_layout(layouts):
    """Per unit, the time floor (its nodes and the edges into them), the activation floor and the
    recomputed unit's extra are at most what every layout of the group takes and holds."""
    search, _, every = layouts
    for s, c in every:
        assert np.all(unit_floors(search, c) <= s.time * (1 + 1e-9) + 1e-15), c.describe()
        floors = memory_floors(search, c)
        assert np.all(floors.acts <= s.acts + 1e-6), c.describe()
        assert np.all(floors.acts <= s.sp_acts + 1e-6), c.describe()  # or under sequence parallelism
        assert np.all(floors.rerun <= s.full_acts - s.acts + 1e-6), c.describe()


def test_the_first_bound_with_the_sync_is_below_every_layout_and_sees_the_sync(layouts):
    """The bound a candidate is first queued with, ``max(compute, sync_lb) + rest`` (no group
    solved), is at most its price under every layout, fitting or not (neither term depends on
    memory); for data parallelism, whose step here is mostly its collectives, it is at least half
    the best layout's price (compute at peak alone is a thousandth of it)."""
    search, cands, every = layouts
    least = {}
    for s, c in every:
        least[c] = min(least.get(c, math.inf), _price(search, s, c).cost)
    for comp, rest, _, c in cands:
        first = max(comp, sync_lb(c, search.totals, search.cluster, comp)) + rest
        assert first <= least[c] * (1 + 1e-9), c.describe()
        if c.degrees.d > 1:
            assert first >= 0.5 * least[c], c.describe()


@pytest.mark.parametrize("share", [1.0, 0.5, 0.2])
def test_each_candidates_bound_is_below_its_best_layout_and_tight(layouts, share):
    """Per candidate, at a roomy capacity and at ones a half and a fifth of the priced layouts fit:
    the bound any layout respects (``any_layout_bound``: the pipeline, the cuts, the data-parallel
    sync) is at most the candidate's best fitting layout, its memory floor at most the least memory
    of any layout; a candidate of one layout that does not fit gets a memory floor over the capacity
    or no fitting cut (ZeRO-3's gathered parameters count). On this graph the sync floor and the transients make every bound at least half
    the candidate's optimum (the compute-and-balance bound alone is below a hundredth of it for
    data parallelism: a step here is mostly its collectives' latency)."""
    search, cands, every = layouts
    memory = sorted(_price(search, s, c).memory for s, c in every)
    search.capacity = memory[min(int(len(memory) * share), len(memory) - 1)]
    best, least = {}, {}
    for s, c in every:
        pr = _price(search, s, c)
        least[c] = min(least.get(c, math.inf), pr.memory)
        if pr.fits:
            best[c] = min(best.get(c, math.inf), pr.cost)
    for comp, rest, static, c in cands:
        bound = any_layout_bound(search, c, comp, rest)
        floor = memory_floor(search, c, static)
        assert floor <= least[c] * (1 + 1e-9), c.describe()
        if c in best:
            assert bound <= best[c] * (1 + 1e-9), c.describe()
            assert bound >= 0.5 * best[c], c.describe()
        elif c.degrees.t == 1:  # one layout, none fitting: the floors say so
            assert floor > search.capacity or math.isinf(bound), c.describe()


# -- time traded against memory: the Lagrangian bound ------------------------------------------------

@pytest.mark.parametrize("share", [1.0, 0.5, 0.25, 0.2])
def test_the_lagrangian_bound_is_below_every_fitting_layout(layouts, share):
    """Per candidate, at a roomy capacity and at ones a half, a quarter and a fifth of the priced
    layouts fit: the Lagrangian bound (least time + lambda x memory over the layouts, less lambda x
    the capacity) is at most the candidate's best fitting layout, plain or sequence parallel."""
    search, cands, every = layouts
    memory = sorted(_price(search, s, c).memory for s, c in every)
    search.capacity = memory[min(int(len(memory) * share), len(memory) - 1)]
    best = best_fitting(search, every)
    for comp, rest, static, c in cands:
        bound = lagrangian_bound(search, c, comp, rest, static)
        if c in best:
            assert bound <= best[c] * (1 + 1e-9), c.describe()


def test_the_lagrangian_bound_closes_where_the_per_term_floors_stay_loose(layouts):
    """A capacity a quarter of the layouts fit: the tensor-parallel group's fast layouts keep their
    inputs whole and do not fit, its lean ones pay in resharding. The space's bound the search
    states is at most the brute-force optimum and, with time traded against memory, at least 70%
    of it (the per-term floors alone, each node's least time and least memory from its own best
    config, state half of it)."""
    search, _, every = layouts
    memory = sorted(_price(search, s, c).memory for s, c in every)
    search.capacity = memory[len(memory) // 4]
    optimum = min(best_fitting(search, every).values())
    best, _, _, closed = search.best(None, ZEROS, (False, True), schedules=SCHEDULES)
    assert closed and best.cost >= optimum * (1 - 1e-12)
    assert search.space_bound <= optimum * (1 + 1e-9)
    assert search.space_bound >= 0.7 * optimum


class Chain(nn.Module):
    """Eight identical linear blocks and a head: repeated enough for the window (the middle blocks
    share one layout) and for four stages per rank over two pipeline ranks."""

    def __init__(self, width=16, blocks=8):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(blocks))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x).square().mean()


@pytest.mark.parametrize("share", [1.0, 0.25, 0.1, 0.0])
def test_the_middle_block_floor_holds_over_pipelined_windows(share):
    """Tensor 2 x pipeline 2 on 4 A100s, every schedule (interleaved 1F1B with 2 and 4 stages per
    rank): every layout of the window (the middle blocks one layout) priced as the search prices
    it, at capacities down to the least any layout needs. The Lagrangian bound, with its floor of
    the memory the middle blocks' ranks hold, is at most each candidate's best fitting layout."""
    cluster = Cluster.preset("4xA100")
    g = autopar.trace(Chain().to("meta"), (torch.empty(4, 16, device="meta"),))
    search = H.Search(g, cluster, "bf16", "adam", "train", usable_memory(cluster.memory_capacity),
                      lambda t, g=None: dp(t))
    cands = [x for x in search.candidates(None, (0,), (False,), SCHEDULES)
             if x[3].degrees.t == x[3].degrees.p == 2]
    assert any(c.virtual == 4 for *_, c in cands) and search.window(False) is not None
    every = window_layouts(search, cands, cluster)
    memory = sorted(priced(search, s, c, cluster).memory for s, c in every)
    search.capacity = memory[min(int(len(memory) * share), len(memory) - 1)]
    best = {}
    for s, c in every:
        pr = priced(search, s, c, cluster, fitting=True)
        if pr.fits:
            best[c] = min(best.get(c, math.inf), pr.cost)
    assert best
    for comp, rest, static, c in cands:
        if c in best:
            assert lagrangian_bound(search, c, comp, rest, static) <= best[c] * (1 + 1e-9), c.describe()
