"""Lower bounds on the best plan of the hierarchical space under any tensor-group layout
(docs/bound.md): a candidate's memory floor with its microbatches in flight, a bound on its
step from the cuts themselves, and the data-parallel sync every layout waits for. ``search`` is
a ``hierarchical.Search`` (its solved groups)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from autopar.core.batch import batch_dims
from autopar.core.strategy import node_training
from autopar.cost_models.training import accumulation_time
from autopar.cost_models.memory import already_saved, node_memory, saved_tensors
from autopar.planning.backward_held import held_floors, rise_floors
from autopar.planning.context import exchange_times
from autopar.planning.every import every_of, per_unit, recomputed_of
from autopar.planning.least_time import group_spans, least_time, node_floor, unit_floors
from autopar.planning.held_units import capped_floor, fitting_count, held_floor, most_held
from autopar.planning.step_bounds import layout_bound, step_floor
from autopar.cost_models.training import zero3_gathered
from autopar.planning.overlap import window
from autopar.planning.step_price import (Candidate, cut_times, data_groups, dp_sync, in_flight, rerun_share,
                                         zero3_roots, zero_factors)
from autopar.planning.sync_cut import offset_cut
from autopar.search.pipeline import StageCosts, best_cuts


@dataclass(frozen=True)
class MemoryFloors:
    """Per unit, what every layout of a tensor group holds per device at least: the activations
    saved per microbatch in flight, and with recomputation what the recomputed unit holds on top
    of them while its backward runs (``price``'s transient)."""

    acts: np.ndarray
    rerun: np.ndarray
    state: list[list[np.ndarray]]  # per unit, per node: [configs, 3] parameters, gradients, optimizer state
    plain: np.ndarray | None = None  # ``acts`` without sequence parallelism (context ranks are priced so)
    # per unit, per node: whether it has no batch dim (its state kept whole, not cut by ZeRO: units.zero_divided)
    batchless: list[list[bool]] | None = None


def any_layout_bound(search, c: Candidate, comp: float, rest: float, enough: float = math.inf) -> float:
    """The tightest bound on ``c``'s price under any layout this module and ``layout_bound`` give:
    the pipeline part (balanced stages, or the cuts themselves), then the data-parallel sync:
    ``price >= max(pipeline + last bucket, slowest rank's sync) + rest`` (``sync_floors``).
    ``enough``: a bound at least this is as good as a tighter one to the caller (the best fitting
    plan's cost: the search drops the candidate either way), so the cuts' bound, the dear part,
    is left out when the others reach it."""
    bucket, sync = sync_floors(search, c)
    added = float(np.sum(accumulation_floor(search, c)))
    # the balanced stages at the cheap floor first: the exact least time takes a DP over the
    # group's tables (seconds on a big group), asked for only where the cheap one leaves c in play
    pipe = layout_bound(c, balanced(search, c, exact=False), search.cluster, comp, rest, added) - rest
    if step_floor(c, pipe, bucket, sync, rest) < enough:
        pipe = max(pipe, layout_bound(c, balanced(search, c), search.cluster, comp, rest, added) - rest)
    if step_floor(c, pipe, bucket, sync, rest) < enough:
        pipe = max(pipe, held_bound(search, c), capped_bound(search, c))
    if step_floor(c, pipe, bucket, sync, rest) < enough:
        pipe = max(pipe, cut_bound(search, c, rest) - rest)
    return sync_step(search, c, pipe, bucket, sync, rest, enough)


def balanced(search, c: Candidate, exact: bool = True):
    """``search.stats(c)`` with its time the least any layout takes (``least_time``; where that is
    past its budget, the group's own layout's, which only the group's DP vouches for), on one rank
    of a context group 1/k of it plus the K/V gathers (``context.context_stats``): what
    ``layout_bound`` divides over the stages. ``exact`` False: a floor of that least for the
    price of a sum (``least_time.node_floor``), every node at its cheapest config."""
    key = search.group_key(c)
    least = least_time(search, *key, floors=False) if exact else node_floor(search, *key)
    if least is None:  # past its budget: the group's own layout's time, as before (not proven: see docs)
        return search.stats(c)
    one = np.asarray([least / c.degrees.c + search.gathers(c)])
    return dataclasses.replace(search.stats(c), compute=one, comm=np.zeros(1))


def sync_floors(search, c: Candidate) -> tuple[float, float]:
    """(last bucket, slowest rank's sync): seconds of the data-parallel sync every layout and every
    cut of ``c`` waits for. A rank's exposed sync is at least its last bucket, the gradients of its
    first unit (the first rank's is the prologue, unit 0, whatever the cut), and the step is at least
    any rank's whole sync (its overlap window is at most its share of the pipeline: overlap.py).
    Each unit's synced gradients and parameters per device (its nodes' with a batch dim:
    ``_synced``) are at least its unsplit ones over t (every weight matrix is sharded over the
    group, ``units.model_parallel_space``; context ranks hold the group's, whole, and reduce over
    context x data: ``step_price.data_groups``). The sync is
    affine in the bytes with non-negative coefficients, so a rank's is the sync of nothing plus a
    weight per unit it holds: the slowest rank's is at least that of the heaviest rank of the cut
    into p stages that minimises it (exact, ``best_cuts``; with v stages per rank the units some
    rank must hold, ``held_units.most_held``), and at least the average's. (0, 0) with expert
    degrees."""
    deg, m = c.degrees, c.microbatches
    if deg.ep > 1:
        return 0.0, 0.0
    key = ("sync", deg, m, c.zero, c.zero_inner, c.recompute, c.virtual)
    if key not in search.floors:
        whole = search.whole_stats(c.recompute)
        g, p = (_synced(whole, f) / deg.t for f in ("grads", "params"))
        bucket = float(dp_sync(c.zero, float(g[0]), float(p[0]), 1, search.cluster, deg, c.zero_inner))
        base = float(dp_sync(c.zero, 0.0, 0.0, m, search.cluster, deg, c.zero_inner))
        each = np.asarray(dp_sync(c.zero, g, p, m, search.cluster, deg, c.zero_inner))
        weight = np.maximum(each - base, 0.0)
        heaviest = float(np.sum(weight)) / deg.p
        if deg.p > 1 and c.virtual > 1:
            heaviest = max(heaviest, most_held(weight, deg.p))
        elif deg.p > 1 and deg.p <= len(weight):
            n = len(weight)
            costs = StageCosts(1, 1, weight, np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n - 1))
            heaviest = max(heaviest, max(best_cuts(costs, deg.p, math.inf, "1f1b").stage_time))
        search.floors[key] = (bucket, base + heaviest, base, weight)
    return search.floors[key][:2]


def _synced(whole, field: str) -> np.ndarray:
    """Per unit, the unsplit ``field`` bytes the data-parallel sync moves: the state of nodes
    without a batch dim is kept whole, never synced (``UnitStats.whole_params``, as ``price``
    leaves it out)."""
    kept = getattr(whole, "whole_" + field)
    return getattr(whole, field) - (kept if kept is not None else 0.0)


def sync_step(search, c: Candidate, pipe: float, bucket: float, sync: float, rest: float,
              enough: float = math.inf) -> float:
    """``step_floor`` and, for 1F1B and zero bubble over p > 1 ranks, the least over the cuts of
    the largest rank's sync plus the part of ``pipe`` its own window cannot hide
    (``sync_cut.offset_cut``: the later ranks hide more). ``enough``: as ``any_layout_bound``'s."""
    out = step_floor(c, pipe, bucket, sync, rest)
    deg = c.degrees
    if deg.p == 1 or c.virtual > 1 or deg.ep > 1 or out >= enough or not math.isfinite(pipe):
        return out
    sync_floors(search, c)
    key = ("sync", deg, c.microbatches, c.zero, c.zero_inner, c.recompute, c.virtual)
    _, _, base, weight = search.floors[key]
    bubble, share = c.rounds - c.microbatches, rerun_share(c)
    hidden = np.asarray([window(c.zero, c.microbatches, 1.0, r, 1, bubble, share) for r in range(deg.p)])
    return max(out, base + offset_cut(weight, (1.0 - np.minimum(hidden / c.rounds, 1.0)) * pipe) + rest)


def transient_floor(search, c: Candidate) -> float:
    """Bytes every layout of ``c`` holds on top of its fullest stage at least: the recomputed
    unit's activations (the largest floor of them), and ZeRO-3's whole parameters and gradients
    (``step_price.zero3_held``: every root unit's and the two largest blocks', each unit's at
    least its least whole bytes, the sum of its nodes' least: ``training.zero3_gathered`` grows
    with every unit's bytes, so it is at least its value at those floors)."""
    rerun = float(np.max(memory_floors(search, c).rerun)) if c.recompute and c.degrees.c == 1 else 0.0
    if c.recompute and c.degrees.c > 1:  # a context rank's recomputed unit: 1/k of it, or more
        rerun = float(np.max(memory_floors(search, c).rerun)) / c.degrees.c
    if c.zero < 3 or c.degrees.ep > 1:
        return rerun
    key = ("zero3",) + search.group_key(c)
    if key not in search.floors:
        whole, memo = np.asarray([1.0, 1.0, 0.0]), {}
        units = memory_floors(search, c).state
        for unit in units:
            if id(unit) not in memo:
                memo[id(unit)] = sum(float(np.min(k @ whole)) for k in unit)
        # the root units whole and the two largest blocks, as the price counts them (its units named)
        roots = zero3_roots(search.unit_names(), len(units))
        search.floors[key] = zero3_gathered([memo[id(u)] for u in units], roots)
    return rerun + search.floors[key]


def memory_floor(search, c: Candidate, static: float) -> float:
    """Bytes per device that every layout of ``c`` needs in its fullest stage with its transient,
    ``static`` being its floor of parameters, gradients and optimizer state per stage
    (``lower_bound``).

    Activations ``A`` per microbatch over all stages: per node of the group's graph, the least any
    config of its space saves, summed (``memory_floors``); with context ranks, a rank's
    (``context_acts``) and at least the unsplit graph's at the microbatch over t x c. Rank w
    holds ``h_w`` microbatches (``step_price.in_flight``), ``s_w`` of state and ``a_w`` of
    activations, ``sum a_w = A``, ``sum s_w >= S`` (``state_total``);
    it runs v stages of at least one unit each, so ``s_w = v s0 + s'_w``, ``a_w >= v a0`` (``s0``,
    ``a0`` the least unit floors: ``unit_static``, ``memory_floors``). The fullest holds
    ``X >= s_w + h_w a_w`` for every w: ``X >= v (s0 + H a0)`` (H the largest ``h_w``), and
    ``sum_w (X - v s0 - s'_w) / h_w >= A`` gives ``X >= v s0 + (A + (S - p v s0) / H) / sum_w 1 / h_w``;
    also ``X >= (S + A) / p`` (each rank holds at least one microbatch)."""
    deg, v = c.degrees, c.virtual if c.degrees.p > 1 else 1
    if deg.c > 1:  # context ranks split each sequence
        whole = float(np.sum(search.whole_stats(c.recompute).acts))
        own = context_acts(search, c)
        acts = max(whole / (deg.d * c.microbatches * deg.t * deg.c), float(np.sum(own)))
        a0, s0 = float(np.min(own)), float(np.min(unit_static(search, c)))
    else:
        floors = memory_floors(search, c).acts
        acts, a0 = float(np.sum(floors)), float(np.min(floors))
        s0 = float(np.min(unit_static(search, c))) if deg.ep == 1 else 0.0
    held, total = [in_flight(c, w) for w in range(deg.p)], state_total(search, c, static)
    rest, beside = max(total - deg.p * v * s0, 0.0), beside_floors(search, c)
    spread = v * s0 + (acts + rest / max(held) + float(np.sum(beside / held))) / sum(1.0 / h for h in held)
    least = max((total + acts + float(np.sum(beside))) / deg.p, spread,
                max(v * (s0 + h * a0) + b for h, b in zip(held, beside)))
    return least + transient_floor(search, c)


def memory_floor_terms(search, c: Candidate, static: float) -> tuple[float, float]:
    """(K, k): every layout of ``c`` (context degree 1) holds at least ``K + k A`` bytes in its
    fullest rank with its transient, ``A`` its activations per microbatch summed over the model's
    units: ``memory_floor``'s spread term with ``A`` left open (``lagrangian.py`` prices it)."""
    v = c.virtual if c.degrees.p > 1 else 1
    s0 = float(np.min(unit_static(search, c))) if c.degrees.ep == 1 else 0.0
    held = [in_flight(c, w) for w in range(c.degrees.p)]
    spread = sum(1.0 / h for h in held)
    rest = max(state_total(search, c, static) - c.degrees.p * v * s0, 0.0)
    beside = float(np.sum(beside_floors(search, c) / held))
    return v * s0 + (rest / max(held) + beside) / spread + transient_floor(search, c), 1.0 / spread


def state_total(search, c: Candidate, static: float) -> float:
    """Bytes of parameters, gradients and optimizer state the ``p`` ranks of a pipeline of ``c``
    hold at least, summed over the ranks: ``p`` x ``static`` (perfectly sharded, ``lower_bound``),
    and the sum of the units' floors (``unit_static``: each unit is on one rank), less the last
    unit's on one stage (a tied parameter is held once there, ``price``), where they are known
    (not with expert degrees)."""
    if c.degrees.ep > 1:
        return c.degrees.p * static
    units = unit_static(search, c)
    held = float(np.sum(units[:-1] if c.degrees.p == 1 and len(units) > 1 else units))
    return max(c.degrees.p * static, held)


def unit_static(search, c: Candidate) -> np.ndarray:
    """Per unit, the parameters, gradients and optimizer state every layout's unit holds at least,
    ZeRO applied (ZeRO-3's parameters as their shards: the whole ones it holds at once are
    ``transient_floor``'s) but to the nodes without a batch dim (their state kept whole:
    ``units.zero_divided``): per node the least over the configs of its space, summed
    (``memory_floors``)."""
    g, _, _, _ = data_groups(c.degrees, c.zero_inner)
    factors = zero_factors(c.zero, g)
    key = ("static", factors) + search.group_key(c)
    if key not in search.floors:
        scale, memo, floors = 1.0 / np.asarray(factors), {}, memory_floors(search, c)
        for unit, whole in zip(floors.state, floors.batchless):  # the middle units share their window's
            if id(unit) not in memo:
                memo[id(unit)] = sum(float(np.min(k @ (np.ones(3) if w else scale))) for k, w in zip(unit, whole))
        search.floors[key] = np.asarray([memo[id(unit)] for unit in memory_floors(search, c).state])
    return search.floors[key]


def cut_bound(search, c: Candidate, rest: float) -> float:
    """A lower bound on ``c``'s price under any layout from the cuts themselves (1F1B and zero
    bubble over p > 1 stages; else 0): each unit takes at least its own nodes' and inner
    edges' least time (its group tables cut to the unit, solved exactly), holds at least its
    unsplit state over t (ZeRO applied) and its activation floor (``memory_floors``), a cut
    costs what crosses it (``cut_times``: its 1/t slices, whatever the layout), the transient
    comes on top (``transient_floor``), and the cut into p stages that fits is found exactly on
    those floors (``best_cuts``): any layout's cut fits them too and is no faster. With k context
    ranks, a rank's units take 1/k of those floors plus their K/V gathers and hold 1/k of the
    activations plus the gathered K/V (``context.context_stats``). ``math.inf`` when none fits:
    no layout of ``c`` fits."""
    deg, m = c.degrees, c.microbatches
    if deg.p == 1 or c.virtual > 1 or deg.ep > 1:
        return 0.0  # expert degrees change the units' state and work: no floor from them here
    # 1F1B and zero bubble cut alike (the same in flight): one cut per candidate but its schedule
    key = ("cut", deg, m, c.zero, c.zero_inner, c.recompute, search.capacity)
    if key not in search.floors:
        search.floors[key] = _slowest_cut(search, c)
    return c.rounds * search.floors[key] + rest


def _slowest_cut(search, c: Candidate) -> float:
    """The slowest stage of ``cut_bound``'s best cut of the floors (``math.inf`` when none fits)."""
    deg, m = c.degrees, c.microbatches
    s = search.stats(c)
    time, acts = rank_time_floors(search, c), memory_floors(search, c).acts
    if deg.c > 1:  # a context rank: 1/k of the activations and the K/V it holds
        acts = context_acts(search, c)
    costs = StageCosts(search.cluster.devices // deg.p, m, time, np.zeros(len(s.spans)),
                       unit_static(search, c), acts, cut_times(s.boundary, deg, search.cluster))
    sol = best_cuts(costs, deg.p, search.capacity - transient_floor(search, c), "1f1b")
    return math.inf if sol is None else max(sol.stage_time)


def rank_time_floors(search, c: Candidate) -> np.ndarray:
    """Per unit, the least per-microbatch time a rank running it takes under any layout: its
    nodes, the edges into them and its gradients' accumulation (``unit_floors``,
    ``accumulation_floor``); with k context ranks 1/k of that plus the unit's K/V exchange, as
    the search prices it (``context.context_stats``)."""
    time = unit_floors(search, c) + accumulation_floor(search, c)
    if c.degrees.c > 1:
        link, call = search._kv_link(c), search.cluster.call_latency
        time = time / c.degrees.c + per_unit(search, c.recompute, lambda rc: exchange_times(*link, call, rc))
    return time


def held_bound(search, c: Candidate) -> float:
    """Seconds of ``c``'s pipeline (``rounds`` x its slowest rank) no layout beats from the whole
    units some rank holds (``held_units.held_floor`` over ``rank_time_floors``); 0 with expert
    degrees (their units' work is not floored here)."""
    if c.degrees.ep > 1:
        return 0.0
    cut = cut_times(search.stats(c).boundary, c.degrees, search.cluster)
    v = c.virtual if c.degrees.p > 1 else 1
    return c.rounds * held_floor(rank_time_floors(search, c), cut, c.degrees.p, v)


def capped_bound(search, c: Candidate) -> float:
    """Seconds of an interleaved ``c``'s pipeline no layout that fits beats from the units each
    rank's memory caps it at (``held_units.capped_floor``): rank w holds ``h_w`` microbatches in
    flight (``in_flight``), so a unit takes at least its state floor plus ``h_w`` times its
    activation floor there (``unit_static``, ``memory_floors``; ``price`` checks every rank's
    state, activations in flight and the transient against the capacity), and the room is the
    capacity less the transient floor. ``math.inf`` when no rank assignment fits; 0 for 1F1B and
    zero bubble (``cut_bound`` cuts them exactly), with context or expert degrees."""
    deg = c.degrees
    if deg.p == 1 or c.virtual == 1 or deg.c > 1 or deg.ep > 1:
        return 0.0
    room = search.capacity - transient_floor(search, c) - beside_floors(search, c)
    static, acts = unit_static(search, c), memory_floors(search, c).acts
    caps = [fitting_count(static + in_flight(c, w) * acts, room[w]) for w in range(deg.p)]
    cut = cut_times(search.stats(c).boundary, deg, search.cluster)
    return c.rounds * capped_floor(rank_time_floors(search, c), caps, cut, c.virtual)


def beside_floors(search, c: Candidate) -> np.ndarray:
    """Per rank of ``c``'s pipeline, the bytes every layout's rank holds beside its saved
    activations at least (``backward_held.held_floors`` on the cuts' bytes per device of a
    context rank, ``search.stats``); zeros with expert degrees (their units are not floored here)."""
    deg = c.degrees
    if deg.p == 1 or deg.ep > 1:
        return np.zeros(deg.p)
    v, rise = c.virtual if deg.p > 1 else 1, None
    if deg.c == 1 and search.mode == "train" and not every_of(c.recompute):  # a ring's units hold a transient
        key = ("rise",) + search.group_key(c)
        if key not in search.floors:
            s, (spans, take) = search.stats(c), group_spans(search, c)
            rise = rise_floors(s.graph, spans, s.tables.configs, s.cluster.mesh())
            search.floors[key] = rise if rise is None or take is None else rise[take]
        rise = search.floors[key]
    return held_floors(search.stats(c).boundary, [in_flight(c, w) for w in range(deg.p)], v, rise)


def memory_floors(search, c: Candidate) -> MemoryFloors:
    """``MemoryFloors`` of ``c``'s group: per node of its graph (at the microbatch), the least
    activations any config of its space saves (``cost_models.memory.node_memory``, as
    ``units.unit_stats`` counts them) and the least the node adds while recomputed, summed per
    unit. Each is separable over nodes, so the sum of the least is the least of the sum."""
    key = ("memory",) + search.group_key(c)
    if every_of(c.recompute):  # each unit as its own block is recomputed or not (planning/every.py)
        plain, full = (memory_floors(search, dataclasses.replace(c, recompute=rc)) for rc in (False, True))
        mask = recomputed_of(search, c.recompute)
        acts, rerun = np.where(mask, full.acts, plain.acts), np.where(mask, full.rerun, 0.0)
        return MemoryFloors(acts, rerun, full.state, np.where(mask, full.plain, plain.plain), full.batchless)
    if key not in search.floors:
        s = search.stats(c)
        spans, take = group_spans(search, c)
        mesh, g, mode, opt = s.cluster.mesh(), s.graph, search.mode, search.optimizer
        dup = already_saved(g)
        acts, rerun, state, kept = np.zeros(len(spans)), np.zeros(len(spans)), [], np.zeros(len(spans))
        no_batch, batchless = {name for name, dim in batch_dims(g).items() if dim is None}, []
        cache: dict[tuple, tuple] = {}  # identical nodes share their config list (as in unit_stats)
        for k, (a, b) in enumerate(spans):
            seen: set[str] = set()  # a parameter used twice in a unit is counted once (units.unit_stats)
            state.append([])
            batchless.append([g.nodes[i].name in no_batch for i in range(a, b)])
            for i in range(a, b):
                node, shared = g.nodes[i], dup.get(g.nodes[i].name, frozenset())
                skip = frozenset(p.source for p in node.params if p.source in seen)
                at = (id(s.tables.configs[i]), skip, shared)
                if at not in cache:
                    cache[at] = _node_floors(node, s.tables.configs[i], mesh, mode, opt, skip, shared)
                saved, extra, held, whole = cache[at]
                acts[k] += saved
                kept[k] += whole
                rerun[k] += extra
                state[-1].append(held)
                seen.update(p.source for p in node.params)
        if take is not None:
            acts, rerun, state, kept = acts[take], rerun[take], [state[u] for u in take], kept[take]
            batchless = [batchless[u] for u in take]
        search.floors[key] = MemoryFloors(acts, rerun, state, kept, batchless)
    return search.floors[key]


def _node_floors(node, configs, mesh, mode, opt, skip, shared) -> tuple[float, float, np.ndarray, float]:
    """(least activations saved, least extra while recomputed, [configs, 3] state, least activations
    saved without sequence parallelism) of one node over its configs, as ``units.unit_stats``
    counts them (``full_acts``: saved without recomputation).
    The activations as the layout saves them or under sequence parallelism (each saved tensor at
    1/t of the group: ``units.sequence_parallel_saved``), whichever is less: the search prices
    either (``activations.price_fitting``); the latter's recomputed extra is only larger."""
    rec = node_training(node)
    plain = dataclasses.replace(node, attrs={**node.attrs, "train": dataclasses.replace(rec, recompute=False)})
    saved, extra, held, unsplit = [], [], [], []
    for cfg in configs:
        mb = node_memory(node, cfg, mesh, mode, opt, skip, shared=shared)
        kept = sum(nbytes for nbytes, _ in saved_tensors(node, cfg, mesh, mode, shared)) / mesh.size
        saved.append(min(mb.activations, kept))
        unsplit.append(mb.activations)
        extra.append(node_memory(plain, cfg, mesh, mode, opt, skip, shared=shared).activations - mb.activations
                     if rec.recompute else 0.0)
        held.append((mb.params, mb.grads, mb.optimizer))
    return min(saved), min(extra), np.asarray(held, dtype=float), min(unsplit)


def context_acts(search, c: Candidate) -> np.ndarray:
    """Per unit, the activations a rank of ``c``'s context group of k saves per microbatch under any
    layout: 1/k of its group's, as the layout saves them (context ranks are priced without
    sequence parallelism: ``activations.price_fitting``), the least per node (``memory_floors``),
    plus the other ranks' K/V where it gathers them and does not recompute the unit
    (``context.context_stats``; a ring keeps none)."""
    deg, plain = c.degrees, memory_floors(search, c).plain / c.degrees.c
    if deg.ring:
        return plain
    held = search._kv_link(c)[0] / deg.t * (deg.c - 1) / deg.c
    return plain + per_unit(search, c.recompute, lambda rc: np.zeros(len(held)) if rc else held)


def accumulation_floor(search, c: Candidate) -> np.ndarray:
    """Per unit, the seconds per microbatch every layout spends at least adding gradients into the
    held ones (``step_price.accumulated``): ``training.accumulation_time`` of the least gradient
    bytes any config of each node holds (``memory_floors``' state, ZeRO applied), summed per
    unit; separable over nodes and increasing in the bytes. On one stage a tied parameter has one
    gradient, counted in the first and the last unit here: the last unit's floor is left out.
    Zeros with expert degrees (their gradients are split apart: ``step_price.expert_split``)."""
    if c.degrees.ep > 1 or c.microbatches <= 1:
        return np.zeros(len(search.spans))
    key = ("grads",) + search.group_key(c)
    if key not in search.floors:  # the middle units share their window unit's list
        memo: dict[int, float] = {}
        for unit in memory_floors(search, c).state:
            if id(unit) not in memo:
                memo[id(unit)] = sum(float(np.min(k[:, 1])) for k in unit)
        search.floors[key] = np.asarray([memo[id(unit)] for unit in memory_floors(search, c).state])
    g, _, _, _ = data_groups(c.degrees, c.zero_inner)
    _, fg, _ = zero_factors(c.zero, g)
    out = accumulation_time(search.floors[key] / fg, c.microbatches, search.cluster.memory_bandwidth)
    if c.degrees.p == 1 and len(out) > 1:
        out[-1] = 0.0
    return out
