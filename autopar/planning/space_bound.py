"""Lower bounds on the best plan of the hierarchical space under any tensor-group layout
(docs/bound.md): a candidate's memory floor with its microbatches in flight, and a bound on its
step from the cuts themselves. ``search`` is a ``hierarchical.Search`` (its solved groups)."""

from __future__ import annotations

import math

import numpy as np

from autopar.core.tables import CostTables
from autopar.planning.step_price import Candidate, data_groups, in_flight, level_link, pipeline_level, zero_factors
from autopar.search.pipeline import StageCosts, best_cuts


def memory_floor(search, c: Candidate, static: float) -> float:
    """Bytes per device that every layout of ``c`` needs in its fullest stage, ``static``
    being its floor of parameters, gradients and optimizer state per stage (``lower_bound``).

    Activations: the unsplit graph's saved activations at the whole batch (one device's
    group, solved once per recomputation), scaled to the microbatch (no more than its share:
    what a batch-free tensor saves does not shrink with it), split perfectly over the group's
    t devices: ``A`` per microbatch over all stages. Stage w holds ``h_w`` microbatches
    (``step_price.in_flight``) and ``s_w`` of state, so the fullest holds ``X >= s_w + h_w a_w``
    for every w with ``sum a_w = A``: ``sum_w (X - s_w) / h_w >= A``, and as ``h_w <= H``,
    ``X >= (A + S / H) / sum_w 1 / h_w`` with ``S = p x static``; also ``X >= static + A / p``
    (each stage holds at least one microbatch)."""
    deg = c.degrees
    whole = float(np.sum(search.whole_stats(c.recompute).acts))
    acts = whole / (deg.d * c.microbatches * deg.t * deg.c)  # context ranks split each sequence
    held = [in_flight(c, w) for w in range(deg.p)]
    spread = (acts + deg.p * static / max(held)) / sum(1.0 / h for h in held)
    return max(static + acts / deg.p, spread)


def cut_bound(search, c: Candidate, rest: float) -> float:
    """A lower bound on ``c``'s price under any layout from the cuts themselves (1F1B and zero
    bubble over p > 1 stages; else 0): each unit takes at least its own nodes' and inner
    edges' least time (its group tables cut to the unit, solved exactly), holds at least its
    unsplit state and activations over t (ZeRO applied), and the cut into p stages that
    fits is found exactly on those floors (``best_cuts``): any layout's cut fits them too and
    is no faster. ``math.inf`` when none fits: no layout of ``c`` fits."""
    deg, m = c.degrees, c.microbatches
    if deg.p == 1 or c.virtual > 1 or deg.ep > 1:
        return 0.0  # expert degrees change the units' state and work: no floor from them here
    s, whole = search.stats(c), search.whole_stats(c.recompute)
    g, _, _, _ = data_groups(deg, c.zero_inner)
    fp, fg, fo = zero_factors(c.zero, g)
    static = (whole.params / fp + whole.grads / fg + whole.optimizer / fo) / deg.t
    acts = whole.acts / (deg.d * m * deg.t * deg.c)  # a context rank: 1/c of each unit's work and more
    bw, lat = level_link(search.cluster, pipeline_level(deg))
    cut = 2 * (lat + search.cluster.call_latency + s.boundary / bw)
    costs = StageCosts(search.cluster.devices // deg.p, m, unit_floors(search, c) / deg.c, np.zeros(len(s.spans)),
                       static, acts, cut)
    sol = best_cuts(costs, deg.p, search.capacity, "1f1b")
    return math.inf if sol is None else c.rounds * max(sol.stage_time) + rest


def unit_floors(search, c: Candidate) -> np.ndarray:
    """Per unit, the least per-microbatch time of its own nodes and the edges among them."""
    key = search.group_key(c)
    if key not in search.floors:
        t = search.stats(c).tables
        win = search.window(c.recompute)
        spans = win.spans if win is not None else search.spans
        least = []
        for a, b in spans:
            edges = {(u - a, v - a): e for (u, v), e in t.edge_cost.items() if a <= u and v < b}
            sub = CostTables(t.nodes[a:b], t.configs[a:b], t.node_cost[a:b], edges,
                             [np.zeros(len(k)) for k in t.configs[a:b]])
            least.append(float(search.solve(sub).cost))
        least = np.asarray(least)
        search.floors[key] = least[np.asarray(win.unit_map)] if win is not None else least
    return search.floors[key]
