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
(``search.dp.least_cost``, on the relaxation with those values detached where there are some,
``relaxed.detached``, a floor of the same). Where that DP's work is past ``LEAST_WORK`` (a group
spanning nodes: seconds a solve, as much as the group's own), the callers fall back on the
group's own layout's time (not proven), or on the sum of the per-unit floors (``unit_floors``:
each unit's nodes and the edges into them, solved alone; a DP per unit, dear at that size too).
``units.unit_stats`` prices a unit as its nodes' costs and the edges into them, plus output
reductions, which only add, so every layout's ``sum(s.time)`` is at least this. A cheaper floor
of the same, every node and edge at its least entry (``node_floor``), settles most candidates
first (``space_bound.any_layout_bound``)."""

from __future__ import annotations

import math

import numpy as np

from autopar.core.tables import CostTables
from autopar.planning.every import every_of, recomputed_of, recomputed_units
from autopar.planning.relaxed import detached
from autopar.search.common import SearchTooLargeError
from autopar.search.dp import least_cost

LEAST_WORK = 2e7  # DP work (``search.dp.least_cost``) above which the exact least is not solved (about 0.5 s)


def least_time(search, tensor: tuple[int, int], microbatch: int, recompute,
               floors: bool = True) -> float | None:
    """The least per-microbatch time of the model's units over every layout of the group
    ``(tensor, microbatch, recompute)`` of ``search`` (a ``hierarchical.Search``); where solving it
    exactly would cost past ``LEAST_WORK``, a floor of it (``unit_floors``' sum: a DP per unit),
    or with ``floors`` False None."""
    key = ("least", tensor, microbatch, recompute)
    if key not in search.floors:
        search.floors[key] = _solve(search, tensor, microbatch, recompute)
    least = search.floors[key]
    if least is None and floors:
        return float(np.sum(_unit_floors(search, tensor, microbatch, recompute)))
    return least


def _solve(search, tensor, microbatch, recompute) -> float | None:
    try:
        return least_cost(_weighted(search, tensor, microbatch, recompute), LEAST_WORK, reuse=False)
    except SearchTooLargeError:
        return None


def node_floor(search, tensor: tuple[int, int], microbatch: int, recompute) -> float:
    """A floor of ``least_time`` for the price of a sum: every node at its cheapest config and
    every edge at its cheapest entry, in the same weighted tables. Costs are times, never
    negative, so any layout's total is at least it; it leaves out what the layouts' meetings cost
    (the reshards a layout's choices force), which ``least_time`` solves a DP for: the search asks
    for that only where this floor does not already settle the candidate."""
    key = ("node", tensor, microbatch, recompute)
    if key not in search.floors:
        t = _weighted(search, tensor, microbatch, recompute)
        search.floors[key] = (sum(float(np.min(c)) for c in t.node_cost)
                              + sum(float(np.min(e)) for e in t.edge_cost.values()))
    return search.floors[key]


def _weighted(search, tensor, microbatch, recompute) -> CostTables:
    """The group's tables with each node, and every edge into it, weighed by the model's units its
    unit stands for, no memory limit (the least over every layout), detached where the planner
    keeps values whole (``relaxed.detached``)."""
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
    free = [np.zeros(len(k)) for k in base.configs]
    tables = CostTables(base.nodes, base.configs, cost, edges, free, math.inf)
    relaxed = detached(tables, search._stats(tensor, microbatch, kinds[-1][0]).graph)
    return relaxed if relaxed is not None else tables


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


def group_spans(search, c):
    """The group's units as its tables see them, and the map from the model's units to them."""
    return _spans(search, c.recompute)


def _spans(search, recompute):
    win = search.window(recompute)
    return (win.spans, np.asarray(win.unit_map)) if win is not None else (search.spans, None)


def unit_floors(search, c) -> np.ndarray:
    """Per unit of the model, the least per-microbatch time of its own nodes and every edge into
    them under any layout of ``c``'s group (``_unit_floors``)."""
    return _unit_floors(search, *search.group_key(c))


def _unit_floors(search, tensor, microbatch, recompute) -> np.ndarray:
    """Per unit, the least per-microbatch time of its own nodes and every edge into them: a unit's
    time in ``units.unit_stats`` is its nodes' costs and the costs of the edges into them (from
    any unit, the resharding its inputs need), so the least of that over the configs of its nodes
    and of the edges' sources (those costing nothing here), solved exactly (``search.solve``),
    bounds it under any layout."""
    key = (tensor, microbatch, recompute)
    if every_of(recompute):  # each unit as its own block is recomputed or not (planning/every.py)
        plain, full = (_unit_floors(search, tensor, microbatch, rc) for rc in (False, True))
        return np.where(recomputed_of(search, recompute), full, plain)
    if key not in search.floors:
        t = search._stats(tensor, microbatch, recompute).tables
        spans, take = _spans(search, recompute)
        least = []
        for a, b in spans:
            src = sorted({u for u, v in t.edge_cost if a <= v < b and u < a})
            pos = {u: k for k, u in enumerate(src + list(range(a, b)))}
            edges = {(pos[u], pos[v]): e for (u, v), e in t.edge_cost.items() if a <= v < b and u in pos}
            sub = CostTables([t.nodes[u] for u in src] + t.nodes[a:b], [t.configs[u] for u in src] + t.configs[a:b],
                             [np.zeros(len(t.configs[u])) for u in src] + t.node_cost[a:b], edges,
                             [np.zeros(len(t.configs[u])) for u in pos])
            least.append(float(search.solve(sub).cost))
        least = np.asarray(least)
        search.floors[key] = least[take] if take is not None else least
    return search.floors[key]
