"""The least per-microbatch time of a tensor group's units under any layout of its space
(docs/bound.md, "Balanced stages"): the ``T*`` the balanced and the reference floors divide.

The group's own layout is not it. Where the repeated blocks share one layout (a window,
``core.blocks.block_window``), a model's time counts the window's middle block once per middle
block, while the group's DP weighs every window unit once: a layout whose middle block is cheaper
by what its first block pays more (a chain of linear layers whose middle blocks take their inputs
split as the first hands them on) is slower in the window and faster in the model. And the
planner's solve may keep cheap values many layers read whole (``planning/whole.py``) where the
space lets them take any config. So the least is solved here: the group's tables with each node,
and every edge into it, weighed by the model's units its unit stands for, solved exactly
(``search.dp``; past its budget, on the relaxation with those values detached,
``relaxed.detached``, a floor of the same; past that, the sum of the per-unit floors,
``space_bound.unit_floors``). ``units.unit_stats`` prices a unit as its nodes' costs and the edges
into them, plus output reductions, which only add, so every layout's ``sum(s.time)`` is at least
this."""

from __future__ import annotations

import math

import numpy as np

from autopar.core.tables import CostTables
from autopar.planning.every import every_of, recomputed_units
from autopar.planning.relaxed import detached
from autopar.search.common import SearchTooLargeError
from autopar.search.dp import dp


def least_time(search, tensor: tuple[int, int], microbatch: int, recompute) -> float | None:
    """The least per-microbatch time of the model's units over every layout of the group
    ``(tensor, microbatch, recompute)`` of ``search`` (a ``hierarchical.Search``), or None where
    its tables are past the DP's budget, relaxed too."""
    key = ("least", tensor, microbatch, recompute)
    if key not in search.floors:
        search.floors[key] = _solve(search, tensor, microbatch, recompute)
    return search.floors[key]


def _solve(search, tensor, microbatch, recompute) -> float | None:
    k = every_of(recompute)
    win = search.window(True if k else recompute)
    mask = recomputed_units(search.spans, search.blocks, k) if k else None
    kinds = ((False, ~mask), (True, mask)) if k else ((recompute, np.ones(len(search.spans), bool)),)
    cost, edges, base = None, {}, None
    for rc, units in kinds:  # every k-th block: each node costs as its units are recomputed or not
        t = search._stats(tensor, microbatch, rc).tables
        weight = _node_weights(search, win, units)
        node = [w * c for w, c in zip(weight, t.node_cost)]
        cost = node if cost is None else [a + b for a, b in zip(cost, node)]
        for (u, v), e in t.edge_cost.items():
            edges[(u, v)] = edges.get((u, v), 0.0) + weight[v] * e
        base = t
    free = [np.zeros(len(k)) for k in base.configs]  # no memory limit: the least over every layout
    tables = CostTables(base.nodes, base.configs, cost, edges, free, math.inf)
    graph = search._stats(tensor, microbatch, kinds[-1][0]).graph
    for relax in (False, True):
        try:
            if relax and (tables := detached(tables, graph)) is None:
                return None
            sol = dp(tables, ilp_fallback=False)
            return float(sol.cost - sol.gap * abs(sol.cost))
        except SearchTooLargeError:
            continue
    return None


def _node_weights(search, win, units: np.ndarray) -> np.ndarray:
    """Per node of the group's graph (the window's where there is one): how many of the model's
    units selected by ``units`` its unit stands for."""
    if win is None:
        spans, take = search.spans, np.arange(len(search.spans))
    else:
        spans, take = win.spans, np.asarray(win.unit_map)
    count = np.zeros(len(spans))
    np.add.at(count, take, np.asarray(units, dtype=float))
    out = np.zeros(spans[-1][1])
    for w, (a, b) in enumerate(spans):
        out[a:b] = count[w]
    return out
