"""A Lagrangian lower bound on a candidate's step under any tensor-group layout that fits
(docs/bound.md, "Time traded against memory").

The other floors (``space_bound``) take each node's least time and least memory from its own
best config, so a candidate whose fast layouts need twice the memory there is, and whose lean
layouts pay in resharding, keeps a floor near its unconstrained time. Here the two are traded in
one exact DP: the memory every layout's fullest rank holds is at least ``K + k A(L)`` (``A(L)``
the layout's activations per microbatch over the model, separable over nodes;
``memory_floor``'s derivation), so for every multiplier ``lam >= 0``

    min over fitting L of T(L)  >=  min over L of (T(L) + lam (K + k A(L) - C))

(weak duality: on a fitting layout the added term is <= 0). ``search.dp`` maximises this over
``lam`` with its breakpoint method on tables whose memory is ``A``; ``InfeasibleError`` from it
says no layout fits. Sequence parallelism (``activations.price_fitting``) is the second way a
layout keeps its activations: bounded the same way with its gathers added to the time, and the
candidate's bound is the lower of the two."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from autopar.core.errors import InfeasibleError
from autopar.core.tables import CostTables
from autopar.cost_models.memory import already_saved, node_memory
from autopar.planning.relaxed import detached
from autopar.planning.space_bound import (accumulation_floor, group_spans, memory_floor_terms, sync_floors,
                                          sync_step,
                                          transient_floor, unit_static)
from autopar.planning.step_bounds import layout_bound
from autopar.planning.step_price import Candidate, in_flight
from autopar.planning.units import sequence_parallel_saved
from autopar.search.common import SearchTooLargeError
from autopar.search.dp import dp

MULTIPLIERS = 12  # breakpoint re-solves per bound: each is one DP of the group's tables


def lagrangian_bound(search, c: Candidate, comp: float, rest: float, static: float) -> float:
    """A lower bound on ``c``'s price under any layout that fits the search's capacity (``math.inf``
    when none fits); 0 with expert degrees. With ``k`` context ranks each runs ``1/k`` of the
    group's work and saves ``1/k`` of its activations, plus the K/V gathers and, without
    recomputation, the gathered K/V (``context.context_stats``): the same DP, scaled."""
    deg = c.degrees
    if deg.ep > 1:
        return 0.0
    s, ctx = search.stats(c), deg.c
    weight, plain, kept, gathers, middle, q, mid_unit = _node_terms(search, c)
    held_kv = np.zeros(len(search.spans))  # per unit of the model: the other context ranks' K/V, saved
    if ctx > 1 and not c.recompute and not deg.ring:  # a ring saves no other rank's K/V
        held_kv = search._kv_link(c)[0] / deg.t * (ctx - 1) / ctx
    forms = memory_forms(search, c, static, weight / ctx, middle / ctx, q, mid_unit, held_kv)
    none = [0.0] * len(weight)
    variants = ((plain, none), (kept, gathers)) if ctx == 1 else ((plain, none),)
    bucket, sync = sync_floors(search, c)
    least = -math.inf if not forms else math.inf
    for acts, extra in variants:
        cost = [w / ctx * (nc + x) for w, nc, x in zip(weight, s.tables.node_cost, extra)]
        edges = {(u, v): weight[v] / ctx * e for (u, v), e in s.tables.edge_cost.items()}
        lower = 0.0  # the least per-microbatch time of the model's units, over the layouts that fit
        for const, coef in forms:
            room = search.capacity - const
            memory = [k * a for k, a in zip(coef, acts)]
            if room < sum(float(np.min(m)) for m in memory):
                lower = math.inf  # no layout of this kind fits
                break
            try:
                sol = _solve(CostTables(s.tables.nodes, s.tables.configs, cost, edges, memory, room), s.graph)
            except InfeasibleError:
                lower = math.inf
                break
            except SearchTooLargeError:  # its tables past the DP's budget: no bound from this floor
                continue
            lower = max(lower, sol.cost - sol.gap * abs(sol.cost))
        if math.isinf(lower):
            continue
        one = dataclasses.replace(s, compute=np.asarray([lower + search.gathers(c)]), comm=np.zeros(1))
        pipe = layout_bound(c, one, search.cluster, comp, rest, float(np.sum(accumulation_floor(search, c)))) - rest
        least = min(least, sync_step(search, c, pipe, bucket, sync, rest))
    return max(least, 0.0)


def _solve(tables: CostTables, graph):
    """The Lagrangian DP on ``tables``, or where they are past the DP's budget on their relaxation
    with the values many layers read detached (``relaxed.detach``: a lower bound of a lower bound)."""
    try:
        return dp(tables, ilp_fallback=False, max_multipliers=MULTIPLIERS)
    except SearchTooLargeError:
        relaxed = detached(tables, graph)
        if relaxed is None:
            raise
        return dp(relaxed, ilp_fallback=False, max_multipliers=MULTIPLIERS)


def memory_forms(search, c: Candidate, static: float, weight: np.ndarray, middle: np.ndarray, q: int,
                 mid_unit: int, held_kv: np.ndarray) -> list[tuple[float, np.ndarray]]:
    """Linear floors ``(K, coef)``: no layout fits unless ``K + sum_i coef_i a_i`` is within the
    capacity (``a_i`` node i's activations per microbatch under its config; ``weight`` and
    ``middle`` already over the context degree, ``held_kv`` per unit on top). ``memory_floor``'s
    spread term over all units (``a_i`` counted once per unit it stands for); and with a window,
    its middle block's activations at most ``middle_floor``'s ``y*``."""
    const, slope = memory_floor_terms(search, c, static)
    forms = [(const + slope * float(np.sum(held_kv)), slope * weight)] if slope > 0 else []
    if mid_unit >= 0:
        y = middle_floor(search, c, int(len(search.spans) - q), q, float(unit_static(search, c)[mid_unit]))
        forms.append((search.capacity - y + float(held_kv[mid_unit]), middle))
    return forms


def middle_floor(search, c: Candidate, count: int, q: int, state: float) -> float:
    """The most activations per microbatch ``y`` the window's middle block may keep in a layout
    that fits (-1 when none may). The ``count`` middle units of the model share the block's
    layout: ``state`` and ``y`` each. Rank w holds ``x_w`` of them and ``h_w`` microbatches in
    flight (``in_flight``), so the fullest rank holds ``X >= x_w (state + h_w y)`` for every w:
    with ``sum x_w = count``, ``X >= count / sum_w 1 / (state + h_w y)``. With v stages per rank,
    each of at least one unit, rank w holds ``x_w >= v - q_w``, ``q_w`` its units that are not the
    middle block, ``sum q_w <= q``: among the k ranks with the most in flight one has
    ``q_w <= q // k``, so ``X >= (v - q // k)(state + h_(k) y)``, ``h_(k)`` the k-th most. All
    grow with y: ``y*`` is where their largest plus the transient floor meets the capacity."""
    v = c.virtual if c.degrees.p > 1 else 1
    held = np.asarray([in_flight(c, w) for w in range(c.degrees.p)])
    ranked = np.sort(held)[::-1]
    units = np.maximum(v - q // np.arange(1, len(ranked) + 1), 0)  # middle units the k-th holds at least
    extra = transient_floor(search, c)

    def need(y: float) -> float:
        return max(float(np.max(units * (state + ranked * y))),
                   count / float(np.sum(1.0 / np.maximum(state + held * y, 1e-300)))) + extra

    if need(0.0) > search.capacity:
        return -1.0
    hi = 1.0
    while need(hi) <= search.capacity and hi < 1e30:
        hi *= 2
    lo = 0.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if need(mid) <= search.capacity else (lo, mid)
    return lo


def _node_terms(search, c: Candidate):
    """Per node of the group's tables: how many of the model's units its unit stands for (the
    window's middle block every middle block), per config the activations it saves as its layout
    keeps them, under sequence parallelism (at most those), and the latter's gathers; which nodes
    are the window's middle block, how many of the model's units are not it, and the first that is."""
    key = ("lagrangian",) + search.group_key(c)
    if key not in search.floors:
        s = search.stats(c)
        spans, take = group_spans(search, c)
        count = np.bincount(take, minlength=len(spans)) if take is not None else np.ones(len(spans), int)
        mid = int(np.argmax(count)) if count.max() > 1 else -1
        g, mesh, mode = s.graph, s.cluster.mesh(), search.mode
        tensor = search.group_key(c)[0]
        link = s.cluster.link(len(tensor) > 1 and tensor[1] > 1)
        dup = already_saved(g)
        weight, middle, plain, kept, gathers, cache = [], [], [], [], [], {}
        for k, (a, b) in enumerate(spans):
            for i in range(a, b):
                node, shared, configs = g.nodes[i], dup.get(g.nodes[i].name, frozenset()), s.tables.configs[i]
                at = (id(configs), shared)
                if at not in cache:
                    sp = [sequence_parallel_saved(node, cfg, s.cluster, mesh, link, mode, shared)
                          for cfg in configs]
                    saved = np.asarray([node_memory(node, cfg, mesh, mode, search.optimizer, shared=shared)
                                        .activations for cfg in configs])
                    cache[at] = (saved, np.minimum(np.asarray([x for x, _ in sp]), saved),
                                 np.asarray([y for _, y in sp]))
                weight.append(float(count[k]))
                middle.append(1.0 if k == mid else 0.0)
                plain.append(cache[at][0])
                kept.append(cache[at][1])
                gathers.append(cache[at][2])
        q = int(np.sum(count)) - (int(count[mid]) if mid >= 0 else 0)
        mid_unit = int(np.flatnonzero(take == mid)[0]) if mid >= 0 else -1
        search.floors[key] = (np.asarray(weight), plain, kept, gathers, np.asarray(middle), q, mid_unit)
    return search.floors[key]


def tighten(search, cands: list, valid: dict, target: float, deadline: float | None = None) -> None:
    """Raise the least bounds of ``valid`` (candidate index -> bound) with ``lagrangian_bound``,
    least first, until the least is one already raised or no lower than ``target`` (the best
    fitting plan's cost), or the deadline passes; a candidate no layout of which fits leaves."""
    done: set[int] = set()
    while valid:
        i = min(valid, key=valid.get)
        if valid[i] >= target * (1 - 1e-12) or i in done:
            return
        if deadline is not None and time.process_time() > deadline:
            return
        done.add(i)
        comp, rest, static, c = cands[i]
        try:
            lag = lagrangian_bound(search, c, comp, rest, static)
        except SearchTooLargeError:  # its group's DP refuses its tables: it keeps the bound it has
            continue
        if math.isinf(lag):
            del valid[i]
        else:
            valid[i] = max(valid[i], lag)
