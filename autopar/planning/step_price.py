"""The step time and memory of one hierarchical candidate, from its tensor group's unit costs.

A candidate is degrees (tensor x pipeline x data per level), a microbatch count ``m``, a ZeRO
stage (over all data-parallel devices, or, ``zero_inner``, over those inside the innermost data
levels, the pods replicating: hybrid sharding) and per-block recomputation. Its step:

* pipeline (``search.pipeline.best_cuts``: exact cuts at unit boundaries, 1F1B, every stage
  fitting): ``(m + p - 1) * t_max + sync_max``, ``t_max`` the slowest stage's compute, tensor-
  parallel communication, send/recv and gradient accumulation (``m - 1`` of the ``m`` microbatches
  add their gradients into the held ones: ``training.accumulation_time``) per microbatch,
  ``sync_max`` its gradient sync inside the tensor group; a stage holds its static state and
  ``p - s`` microbatches of activations;
* data-parallel sync of the slowest stage over its data group, ZeRO-aware
  (``cost_models/training.py``), plus, with ``zero_inner``, an all-reduce of the gradient shards
  across the outer data group; the step waits only for the part that does not fit under the
  rank's compute, at least its last bucket (``overlap.py``);
* the optimizer step of the largest stage (memory-bound, on the ZeRO shard).

Transient memory on top of a stage's peak: one recomputed unit's full activations while its
backward runs, and with ZeRO-3 (per block, as ``fully_shard`` on each block) the root's and two
blocks' parameters and gradients whole (``zero3_held``, ``training.zero3_gathered``: the flat
path prices them with the same function).
Links: a group spanning several levels runs at the slowest level it spans; a data-parallel ring
with k ranks inside each unit below that level gets k devices' links there (``inner_ranks``). A
pipeline cut costs the 1/t slice sent plus the receivers' all-gather (``cut_times``). Context
parallelism (``Degrees.context``) is priced on the unit costs by ``planning/context.py``.

Expert parallelism (``Degrees.expert``, ``ep`` devices of the data group; ``routed.ExpertStats``):
the routed experts' parameters, gradients and optimizer state are divided by ``ep`` and their
ZeRO shards taken over the experts' own data group (``d / ep`` devices), whose gradient sync is
separate from the dense part's; per MoE layer and microbatch, the tokens' dispatch and combine
are all-to-alls over the expert group of ``tokens x top_k x hidden`` bytes per device, twice in
the forward and twice in the backward (three times each with recomputation), at the slowest link
the group spans. Expert compute is unchanged: with uniform routing (an assumption, stated in the
plan) each device runs ``tokens x top_k`` rows of expert matmuls whatever ``ep``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from autopar.core.blocks import block_path
from autopar.core.cluster import Cluster
from autopar.core.strategy import RECOMPUTE_NAMES, RECOMPUTE_POINTWISE, ZERO_NAMES, Degrees
from autopar.cost_models.alpha_beta import collective_time
from autopar.cost_models.memory import optimizer_states
from autopar.planning.backward_held import beside_saved
from autopar.cost_models.training import (accumulation_time, optimizer_step_time, update_working_set,
                                         zero3_gathered, zero_sync_time)
from autopar.planning.every import every_of
from autopar.planning.overlap import exposed, window
from autopar.planning.routed import ExpertStats
from autopar.planning.units import UnitStats, zero_divided
from autopar.core.schedules import SCHEDULES, rounds, runs_as_priced
from autopar.search.pipeline import PipelineSolution, StageCosts, best_cuts


# Pipeline schedules and their bubbles: ``core.schedules`` (one formula, ``rounds``, for both
# planning paths).


RECOMPUTE_WORDS = {False: "no recompute", True: "recompute", **RECOMPUTE_NAMES}


@dataclass(frozen=True)
class Candidate:
    degrees: Degrees
    microbatches: int
    zero: int = 0
    zero_inner: bool = False
    recompute: bool | str | int = False  # or a RECOMPUTE_NAMES mode (strategy.py); k: every k-th block
    schedule: str = "1f1b"  # with one pipeline stage: nothing to schedule
    stages_per_rank: int = 0  # interleaved 1F1B's v (0: the schedule's own, SCHEDULES)

    def describe(self) -> str:
        z = ZERO_NAMES[self.zero] + (" (inside pods: HSDP)" if self.zero_inner else "") if self.zero else "no ZeRO"
        sched = f"; {self.schedule}" if self.degrees.p > 1 else ""
        if self.degrees.p > 1 and self.virtual > 1:
            sched += f" ({self.virtual} stages per rank)"
        return (f"{self.degrees.describe()}; {self.microbatches} microbatch(es){sched}; {z}; "
                f"{RECOMPUTE_WORDS.get(self.recompute, f'recompute every {self.recompute} blocks')}")

    @property
    def virtual(self) -> int:
        """Stages per rank of its schedule."""
        return self.stages_per_rank or SCHEDULES[self.schedule][0]

    @property
    def rounds(self) -> float:
        """Slowest-rank microbatch times per step: ``m`` and the schedule's bubble; interleaved
        1F1B's bubble is ``(p - 1) / v`` of them for any v (Narayanan et al. 2021, 2.2)."""
        return rounds(self.schedule, self.microbatches, self.degrees.p, self.virtual)


def schedule_options(schedules, p: int, units: int) -> list[tuple[str, int]]:
    """(schedule, stages per rank) pairs to search: interleaved 1F1B with v = 2, 4, 8, ... and the
    most the ``units`` allow over ``p`` ranks (its bubble falls as 1/v, its send/recv grows as v:
    doubling v covers the trade at a logarithmic count of candidates); others with their own v."""
    out = []
    for sched in schedules:
        if SCHEDULES[sched][0] == 1:
            out.append((sched, 0))
            continue
        most = units // max(p, 1)
        vs = {v for v in (2 ** k for k in range(1, most.bit_length())) if v <= most} | ({most} if most >= 2 else set())
        out.extend((sched, v) for v in sorted(vs))
    return out


def weighed(c: Candidate, schedules, units: int) -> bool:
    """Whether the search prices ``c``: whole rounds of its p ranks (the bubbles of ``SCHEDULES``),
    at most a unit per stage, a schedule codegen runs as priced (``runs_as_priced``), and 1F1B
    only where zero bubble, at the same cuts and memory and a third of its bubble, is not weighed."""
    p, m = c.degrees.p, c.microbatches
    if p * c.virtual > units or (c.schedule != "1f1b" and m % p) or not runs_as_priced(c.schedule, c.zero, c.recompute):
        return False
    return not (c.schedule == "1f1b" and p > 1 and "zero-bubble" in schedules and m % p == 0
                and runs_as_priced("zero-bubble", c.zero, c.recompute))


@dataclass
class Priced:
    candidate: Candidate
    cost: float
    memory: float  # peak bytes per device
    fits: bool
    solution: PipelineSolution
    terms: dict[str, float] = field(default_factory=dict)
    memory_terms: dict[str, float] = field(default_factory=dict)
    bottleneck: str = ""  # which units the slowest stage holds, in words
    sequence_parallel: bool = False  # its group keeps every saved activation at 1/t (``price_fitting``)


def level_link(cluster: Cluster, level: int) -> tuple[float, float]:
    return cluster.link(min(level, 2))


def reducing(deg: Degrees) -> tuple[int, ...]:
    """Per level, the ranks a gradient is reduced over: data x context."""
    return tuple(d * c for d, c in zip(deg.data, deg.context)) if deg.context else deg.data


def data_groups(deg: Degrees, zero_inner: bool) -> tuple[int, int, int, int]:
    """(ZeRO group size, outer group size, ZeRO group's top level, outer group's top level).
    Gradients are reduced over the context ranks too (they hold the same parameters)."""
    data = reducing(deg)
    levels = [l for l, k in enumerate(data) if k > 1]
    if not levels:
        return 1, 1, 0, 0
    if zero_inner and len(levels) > 1:
        top = levels[-1]
        inner = math.prod(data[:top])
        return inner, data[top], max(l for l in levels if l < top), top
    return math.prod(data), 1, levels[-1], levels[-1]


def pipeline_level(deg: Degrees) -> int:
    levels = [l for l, k in enumerate(deg.pipeline) if k > 1]
    return levels[-1] if levels else 0


def inner_ranks(deg: Degrees, top: int) -> int:
    """Ranks of one data(-and-context) group inside one unit of level ``top - 1`` (a node when
    ``top`` is 1). A ring ordered by unit crosses each unit's boundary once, so the unit's
    ``devices / k`` rings share its ``devices`` links' worth of bandwidth at level ``top``: each
    ring gets ``k`` devices' worth (NCCL's rings are built this way; Megatron-LM 2019's 8.3B run
    has 2 data-parallel ranks per 16-GPU node, 8 rings sharing 8 adapters)."""
    return math.prod(reducing(deg)[:top])


def zero_factors(zero: int, group: int) -> tuple[float, float, float]:
    """What ZeRO divides parameters, gradients and optimizer state by."""
    return (group if zero >= 3 else 1, group if zero >= 2 else 1, group if zero >= 1 else 1)


def dp_sync(zero: int, grads: float, params: float, m: int, cluster: Cluster, deg: Degrees,
            zero_inner: bool):
    """Seconds of one stage's data-parallel sync (numpy-friendly in grads/params)."""
    g, o, lg, lo = data_groups(deg, zero_inner)
    bw, lat = level_link(cluster, lg)
    if lg > 0:  # the ring leaves each lower-level unit once: its k ranks there share one crossing
        bw = min(bw * inner_ranks(deg, lg), level_link(cluster, lg - 1)[0])
    t = zero_sync_time(zero, grads, params, g, bw, lat, m, cluster=cluster)
    if o > 1:
        bw_o, lat_o = level_link(cluster, lo)
        t = t + collective_time("all-reduce", grads / (g if zero >= 1 else 1), o, bw_o, lat_o, cluster.call_latency)
    return t


def cut_times(boundary: np.ndarray, deg: Degrees, cluster: Cluster) -> np.ndarray:
    """Per microbatch, forward and backward, what crossing each cut costs a stage: each device of
    the tensor group sends its 1/t slice to its peer in the next stage over the pipeline's link,
    and the receivers all-gather the t slices over the tensor group's link to rebuild the tensor
    (Megatron-LM's scatter/gather, Narayanan et al. 2021, section 4.1). ``boundary``: bytes per
    device (the slice)."""
    bw, lat = level_link(cluster, pipeline_level(deg))
    send = lat + cluster.call_latency + boundary / bw
    t_levels = [l for l, k in enumerate(deg.tensor) if k > 1]
    if t_levels:
        bw_t, lat_t = level_link(cluster, t_levels[-1])
        send = send + collective_time("all-gather", boundary * deg.t, deg.t, bw_t, lat_t, cluster.call_latency)
    return 2 * send
def expert_degrees(deg: Degrees) -> Degrees:
    """The degrees the routed experts' state sees: data parallelism over ``data / expert``."""
    return Degrees(deg.tensor, deg.pipeline, deg.expert_data)


def expert_level(deg: Degrees) -> int:
    levels = [l for l, k in enumerate(deg.expert) if k > 1]
    return levels[-1] if levels else 0


def all_to_all_time(ex: ExpertStats, deg: Degrees, cluster: Cluster, recompute: bool) -> np.ndarray:
    """[U] seconds per microbatch of the units' token all-to-alls over the expert group.

    A rank sends ``1/ep`` of its rows to each peer over the link to it: to the ``(k_l - 1) x
    (ranks below level l)`` peers first differing at level ``l`` over that level's link (NVLink in
    a node, its own NIC across). The links carry their shares at once: the slowest share's time
    (8 ranks in each of 8 nodes: 7/64 of the rows on NVLink, 56/64 on the NIC, not 63/64 there),
    and ``ep - 1`` latency steps of the slowest link and one call."""
    if deg.ep <= 1:
        return np.zeros(len(ex.layers))
    _, lat = cluster.kind_link("all-to-all", *level_link(cluster, expert_level(deg)))
    per_layer = np.where(ex.layers > 0, ex.dispatch / np.maximum(ex.layers, 1), 0.0)
    ep, below, slowest = float(deg.ep), 1, np.zeros(len(per_layer))
    for level, k in enumerate(deg.expert):
        if k > 1:
            bw, _ = cluster.kind_link("all-to-all", *level_link(cluster, level))
            slowest = np.maximum(slowest, (k - 1) * below / ep * per_layer / bw)
        below *= k
    one = np.where(per_layer > 0, slowest + (ep - 1) * lat + cluster.call_latency, 0.0)
    return np.where(recompute, 6, 4) * ex.layers * one  # per unit where only some are recomputed


def accumulated(c: Candidate, s: UnitStats, ex: ExpertStats | None, fg: float, efg: float,
                cluster: Cluster) -> np.ndarray:
    """[U] seconds per microbatch of adding each microbatch's gradients into the held ones
    (``training.accumulation_time``): the gradient bytes a device holds for each unit, the dense
    part over its ZeRO group (``fg``), the experts' over theirs (``efg``). On one stage a tied
    parameter (the first and the last unit's) has one gradient: counted once, as ``price``
    counts its state."""
    grads = s.grads / fg + (ex.grads / efg if ex is not None else 0.0)
    if c.degrees.p == 1 and s.shared:
        raw = float(np.sum(s.params + s.grads + s.optimizer))
        grads = np.array(grads, dtype=float)
        grads[-1] -= s.shared * float(np.sum(s.grads)) / raw / fg if raw else 0.0
    return accumulation_time(grads, c.microbatches, cluster.memory_bandwidth)


def rerun_units(c: Candidate, s: UnitStats):
    """Whether the units run their forward again: per unit where only some do (every k-th
    block, ``planning/every.py``), else the candidate's one answer."""
    return s.recomputed if s.recomputed is not None else bool(c.recompute)


def rerun_share(c: Candidate):
    """What ``overlap.window`` takes: the candidate's recomputation, or for every k-th block the
    share of the forward run again, 1/k; pointwise recomputation re-runs no matmul (its memory-
    bound ops are a few percent of the forward): 0."""
    if c.recompute == RECOMPUTE_POINTWISE:
        return 0.0
    return 1.0 / every_of(c.recompute) if every_of(c.recompute) else c.recompute


def expert_split(c: Candidate, s: UnitStats, ex: ExpertStats | None):
    """(dense UnitStats part, expert part or None, expert-state divisors (params, grads, optimizer)):
    the experts' state per device divided by ep and by their ZeRO group (``d / ep`` devices)."""
    deg = c.degrees
    if ex is None or deg.ep <= 1:
        return s, None, (1.0, 1.0, 1.0)
    dense = dataclasses.replace(s, params=s.params - ex.params, grads=s.grads - ex.grads,
                                optimizer=s.optimizer - ex.optimizer, numel=s.numel - ex.numel)
    ge, _, _, _ = data_groups(expert_degrees(deg), c.zero_inner)
    fp, fg, fo = zero_factors(c.zero, ge)
    return dense, ex, (deg.ep * fp, deg.ep * fg, deg.ep * fo)


def price(c: Candidate, s: UnitStats, cluster: Cluster, capacity: float, optimizer: str | None,
          master: bool, itemsize: int, names: list[str] | None = None,
          experts: ExpertStats | None = None) -> Priced:
    deg, m = c.degrees, c.microbatches
    p = deg.p
    g, _, _, _ = data_groups(deg, c.zero_inner)
    fp, fg, fo = zero_factors(c.zero, g)
    s, ex, (efp, efg, efo) = expert_split(c, s, experts)
    held_p, held_g, held_o, stepped_n = zero_divided(s, fp, fg, fo)  # state without a batch dim kept whole
    static = held_p + held_g + held_o
    if s.transient is not None:  # the loss's backward working set, once per step
        static = static + s.transient
    if ex is not None:
        static = static + ex.params / efp + ex.grads / efg + ex.optimizer / efo
    if p == 1 and s.shared:  # tied parameters counted by the first and the last unit, one stage
        raw = float(np.sum(s.params + s.grads + s.optimizer))
        static = static.copy()
        static[-1] -= s.shared * float(np.sum(static)) / raw if raw else 0.0
    kept = static - s.transient if s.transient is not None else static  # what the update runs beside
    transient = float(np.max(s.full_acts - s.acts)) if c.recompute else 0.0
    if c.zero >= 3:  # per block, as fully_shard on each block (codegen/zero_units.py)
        transient += zero3_held(s, ex, deg, names)
    cut = np.zeros(max(len(s.spans) - 1, 0))
    if p > 1:
        cut = cut_times(s.boundary, deg, cluster)
    a2a = all_to_all_time(ex, deg, cluster, rerun_units(c, s)) if ex is not None else np.zeros(len(s.spans))
    acc = accumulated(c, s, ex, fg, efg, cluster)
    costs = StageCosts(cluster.devices // p, m, s.time + a2a + acc, s.sync, static, s.acts, cut)
    if c.virtual > 1:
        sol = interleaved_cuts(costs, p, c.virtual, c.rounds)
        fits = sol is not None and max(sol.memory) + transient <= capacity
    else:
        sol = best_cuts(costs, p, capacity - transient, "1f1b")
        fits = sol is not None
        if sol is None:  # priced as written, not fitting
            sol = best_cuts(costs, p, math.inf, "1f1b")
        if c.schedule != "1f1b":  # the same cuts and memory, a smaller bubble
            sol.cost += (c.rounds - (m + p - 1)) * max(sol.stage_time)
    states = optimizer_states(optimizer)
    synced = [s.grads - (s.whole_grads if s.whole_grads is not None else 0.0),  # kept whole: never synced
              s.params - (s.whole_params if s.whole_params is not None else 0.0)]
    dp, opt, update = [], [], []
    ranks = [sol.stages[r::p] for r in range(p)] if c.virtual > 1 else [[st] for st in sol.stages]
    for held_spans in ranks:
        grads, params, numel = (sum(float(np.sum(arr[a:b])) for a, b in held_spans)
                                for arr in (*synced, stepped_n))
        stepped = numel + (sum(float(np.sum(ex.numel[a:b])) for a, b in held_spans) / efo if ex is not None else 0)
        update.append(sum(float(np.sum(kept[a:b])) for a, b in held_spans)
                      + update_working_set(stepped, states, cluster.foreach_update))
        dp.append(float(dp_sync(c.zero, grads, params, m, cluster, deg, c.zero_inner)))
        opt.append(optimizer_step_time(numel, itemsize, states, master, cluster.memory_bandwidth,
                                       foreach=cluster.foreach_update))
        if ex is not None:  # the experts' shards: their own data group, after the dense sync
            xg, xp, xn = (sum(float(np.sum(arr[a:b])) for a, b in held_spans)
                          for arr in (ex.grads, ex.params, ex.numel))
            dp[-1] += float(dp_sync(c.zero, xg / deg.ep, xp / deg.ep, m, cluster, expert_degrees(deg),
                                    c.zero_inner))
            opt[-1] += optimizer_step_time(xn / efo, itemsize, states, master, cluster.memory_bandwidth,
                                           foreach=cluster.foreach_update)
    bubble = c.rounds - m
    shown = []  # per rank: the sync the step waits for, the rest under its compute (overlap.py)
    for r, held_spans in enumerate(ranks):
        u = held_spans[0][0]  # the rank's first unit: its gradients come last in the backward
        bucket = float(dp_sync(c.zero, float(synced[0][u]), float(synced[1][u]), 1, cluster, deg, c.zero_inner))
        under = window(c.zero, m, sol.stage_time[r], r, c.virtual, bubble, rerun_share(c))
        shown.append(exposed(dp[r], bucket, under))
    k = int(np.argmax(sol.stage_time))
    a, b = sol.stages[k]
    cut_full = np.concatenate([[0.0], cut, [0.0]])
    t_max = sol.stage_time[k]
    mine = sol.stages[k::p] if c.virtual > 1 else [(a, b)]  # the slowest rank's stages
    terms = {
        "compute": m * sum(float(np.sum(s.compute[x:y])) for x, y in mine),
        "tensor-parallel communication": m * sum(float(np.sum(s.comm[x:y])) for x, y in mine),
        **({"expert all-to-all": m * sum(float(np.sum(a2a[x:y])) for x, y in mine)} if ex is not None else {}),
        "pipeline send/recv": m * sum(float(cut_full[x] + cut_full[y]) for x, y in mine),
        "gradient accumulation": m * sum(float(np.sum(acc[x:y])) for x, y in mine),
        "pipeline bubble": (c.rounds - m) * t_max,
        "gradient sync inside the tensor group": max(sol.sync) if sol.sync else 0.0,
        "data-parallel sync (exposed)": max(shown),
        "optimizer step": max(opt),
    }
    cost = sol.cost + max(shown) + max(opt)
    beside = beside_saved(s, ranks, [in_flight(c, r) for r in range(len(ranks))])
    backward = [m_ + transient + b_ for m_, b_ in zip(sol.memory, beside)]  # each rank's peak: its backward's or its update's
    sol.memory = [max(b_ - transient, u) for b_, u in zip(backward, update)]
    sol.peaks = [max(b_, u) for b_, u in zip(backward, update)]  # what a rank of the stage holds at most
    peak = max(max(backward), max(update))
    w = int(np.argmax(sol.memory))
    held = in_flight(c, w)
    spans_w = sol.stages[w::p] if c.virtual > 1 else [sol.stages[w]]

    def held_sum(arr) -> float:
        return sum(float(np.sum(arr[x:y])) for x, y in spans_w)

    xp, xg, xo = ((held_sum(ex.params) / efp, held_sum(ex.grads) / efg, held_sum(ex.optimizer) / efo)
                  if ex is not None else (0.0, 0.0, 0.0))
    memory_terms = {
        "parameters": held_sum(held_p) + xp,
        "gradients": held_sum(held_g) + xg,
        "optimizer state + master weights": held_sum(held_o) + xo,
        "activations in flight": held * held_sum(s.acts),
        "transient (recomputed block, gathered ZeRO-3 parameters)": transient,
    }
    if beside[w]:
        memory_terms["stage outputs held for the backward, their gradients; a node's gradients"] = beside[w]
    if update[w] > backward[w]:  # the rank's peak is its update's (torch's foreach update, its buffers)
        memory_terms["update's buffers above the backward's peak (torch's foreach update)"] = update[w] - backward[w]
    a, b = sol.stages[k]
    units = f"{names[a]} .. {names[b - 1]}" if names and b - a > 1 else (names[a] if names else f"units {a}-{b - 1}")
    bottleneck = (f"slowest stage: {b - a} unit(s) ({units}), {fmt(t_max)} per microbatch; fullest stage: "
                  f"{held:.3g} microbatch(es) of activations in flight; data-parallel sync {fmt(max(dp))}, "
                  f"{fmt(max(shown))} of it not under compute")
    return Priced(c, cost, peak, fits and peak <= capacity,
                  sol, terms, memory_terms, bottleneck)


def zero3_held(s: UnitStats, ex: ExpertStats | None, deg: Degrees, names: list[str] | None) -> float:
    """ZeRO-3's whole parameters and gradients beside the shards (``training.zero3_gathered``):
    the root units' (the prologue and the epilogue) and the two largest blocks', the routed
    experts' over ``ep`` (``s`` the dense part, ``ex`` the experts', as ``expert_split`` cuts
    them). Over the whole model, whichever stage holds them (a bound for the others)."""
    whole = s.params + s.grads + ((ex.params + ex.grads) / deg.ep if ex is not None else 0.0)
    return zero3_gathered([float(b) for b in whole], zero3_roots(names, len(whole)))


def zero3_roots(names: list[str] | None, count: int) -> list[bool]:
    """Per unit, whether ZeRO-3 holds it whole all step as the root module's (not a block: the
    prologue, the epilogue); unnamed units are all taken as blocks."""
    return [block_path(n) is None for n in names] if names else [False] * count


def in_flight(c: Candidate, rank: int) -> float:
    """Microbatches of a rank's activations held at its peak: 1F1B's ``min(m, p - rank)`` (zero
    bubble's too); interleaved adds ``(p - 1) / v`` on every rank (Narayanan et al. 2021, 2.2:
    the first rank holds ``p (1 + (p - 1) / (p v))``), counted in whole-rank microbatches."""
    p, m = c.degrees.p, c.microbatches
    if m < p and c.virtual == 1:  # fewer microbatches than stages: run in GPipe's order, all held
        return float(m)
    extra = (p - 1) / c.virtual if c.virtual > 1 else 0.0
    return min(float(m), p - rank + extra)


def interleaved_cuts(costs: StageCosts, p: int, v: int, rounds: float) -> PipelineSolution | None:
    """``p * v`` stages over the units, rank r running stages r, r + p, ...: cut where the slowest
    of the ``p * v`` stages is fastest (``best_cuts``, exact for that), then each rank's time,
    syncs and memory are the sums over its stages. Not exact over cuts for the ranks' sums nor
    with memory (a plan that does not fit is priced as written; the bound covers any cut)."""
    sol = best_cuts(costs, p * v, math.inf, "1f1b")
    if sol is None:
        return None
    times = [sum(sol.stage_time[r::p]) for r in range(p)]
    syncs = [sum(sol.sync[r::p]) for r in range(p)]
    c = Candidate(Degrees((1,), (p,), (1,)), costs.microbatches, schedule="interleaved-1f1b", stages_per_rank=v)
    mems = [sum(float(np.sum(costs.static_memory[a:b])) for a, b in sol.stages[r::p])
            + in_flight(c, r) * sum(float(np.sum(costs.activation_memory[a:b])) for a, b in sol.stages[r::p])
            for r in range(p)]
    return PipelineSolution(sol.stages, costs.devices, costs.microbatches, "interleaved-1f1b",
                            rounds * max(times) + max(syncs), times, mems, syncs)


def fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.4g} ms" if seconds < 1 else f"{seconds:.4g} s"

