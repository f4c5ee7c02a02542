"""The Lagrangian bound of a tensor group whose tables are past the DP's budget, taken on the
relaxation with the values many layers read detached (``planning/relaxed.py``), is still a lower
bound: on a graph small enough to price every layout of every candidate, it is at most the
brute-force optimum at several capacities, and it states more than the floors the search had
before it (where the exact Lagrangian was skipped)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from autopar.planning import lagrangian
from autopar.planning.relaxed import detach
from autopar.search.common import SearchTooLargeError
from autopar.search.dp import dp
from tests.helpers.layouts import SCHEDULES, ZEROS, best_fitting, every_layout, priced

# detached in these tests: the residual stream between the two blocks, read by the second block's
# linear and its add (any set of nodes gives a relaxation; the planner's is ``whole.kept_whole``)
WHOLE = {"add"}


@pytest.fixture(scope="module")
def layouts():
    """Per candidate (no recomputation), every layout of its tensor group, as ``(UnitStats, c)``."""
    return every_layout((False,))


def _past_budget(monkeypatch, relax: bool = True):
    """The exact Lagrangian DP refuses tables that still join ``WHOLE`` to its neighbours (as the
    DP's budget does for a 405B window): only the detached relaxation is solved, or none."""
    real = lagrangian.dp
    seen = []

    def limited(tables, **kw):
        if any({tables.nodes[u], tables.nodes[v]} & WHOLE for u, v in tables.edge_cost):
            raise SearchTooLargeError("past the budget (test)")
        seen.append(True)
        return real(tables, **kw)

    monkeypatch.setattr(lagrangian, "dp", limited)
    monkeypatch.setattr(lagrangian, "detached",
                        (lambda tables, graph: detach(tables, WHOLE)) if relax else (lambda tables, graph: None))
    return seen


def _capacity(search, every, share):
    memory = sorted(priced(search, s, c).memory for s, c in every)
    return memory[min(int(len(memory) * share), len(memory) - 1)]


def test_detached_tables_cost_no_layout_more_than_the_originals(layouts):
    """Layout by layout, the detached tables cost at most what the original ones do, and their
    optimum is at most the original optimum."""
    search, cands, _ = layouts
    seen = set()
    for _, _, _, c in cands:
        s = search.stats(c)
        if id(s.tables) in seen:
            continue
        seen.add(id(s.tables))
        names = WHOLE & set(s.tables.nodes)
        assert names
        t, r = s.tables, detach(s.tables, names)
        assert not any(t.nodes[u] in names or t.nodes[v] in names for u, v in r.edge_cost)
        for choice in itertools.product(*(range(len(k)) for k in t.configs)):
            assert r.total(choice) <= t.total(choice) * (1 + 1e-12) + 1e-15
        assert dp(r).cost <= dp(t).cost * (1 + 1e-12)


@pytest.mark.parametrize("share", [1.0, 0.5, 0.25, 0.2])
def test_the_relaxed_lagrangian_bound_is_below_every_fitting_layout(layouts, share, monkeypatch):
    """With the exact DP refused, each candidate's Lagrangian bound, solved on the detached tables,
    is at most its best fitting layout over every layout, at a roomy capacity and at ones a half,
    a quarter and a fifth of the layouts fit."""
    search, cands, every = layouts
    seen = _past_budget(monkeypatch)
    search.capacity = _capacity(search, every, share)
    best = best_fitting(search, every)
    assert best
    for comp, rest, static, c in cands:
        if c in best:
            assert lagrangian.lagrangian_bound(search, c, comp, rest, static) <= best[c] * (1 + 1e-9), c.describe()
    assert seen  # the relaxation was solved


def test_a_group_past_the_budget_gets_a_bound_tighter_than_its_floors(layouts, monkeypatch):
    """A capacity a quarter of the layouts fit, the exact Lagrangian refused: the space's bound the
    search states with the detached relaxation is at most the brute-force optimum and above the
    bound it states without it (the floors alone, where the Lagrangian was skipped)."""
    search, cands, every = layouts
    search.capacity = _capacity(search, every, 0.25)
    optimum = min(best_fitting(search, every).values())
    bounds = {}
    for relax in (False, True):
        with monkeypatch.context() as m:
            _past_budget(m, relax)
            best, _, _, closed = search.best(None, ZEROS, (False,), schedules=SCHEDULES)
            assert closed and best.cost >= optimum * (1 - 1e-12)
            bounds[relax] = search.space_bound
    assert bounds[True] <= optimum * (1 + 1e-9)
    assert bounds[True] > bounds[False] * (1 + 1e-6)
    assert np.isfinite(bounds[False])
