"""Inter-operator search: cut the topologically ordered graph into pipeline stages.

Input, per (stage device count, microbatch count): the time each node takes per microbatch under
the best intra-operator plan on that many devices, the once-per-step time (gradient
synchronization), the memory each node holds per device (static: parameters, gradients, optimizer
state; per microbatch in flight: saved activations), and the time to send what crosses a cut after
each position. The planner fills these from a cost model; this module only does arithmetic, so it
never imports one.

Model of one training step with S stages of equal device groups and M microbatches (non-interleaved
schedules): both GPipe and 1F1B take ``(M + S - 1) * t_max + sync_max`` (zero bubble
``(M + (S - 1) / 3) * t_max + sync_max`` at 1F1B's memory: ``SCHEDULES``, ``rounds``) where ``t_max`` is the
slowest stage's forward + backward time per microbatch (its compute plus sending its boundary
activations and receiving their gradients) and ``sync_max`` the slowest stage's gradient
synchronization. They differ in memory: GPipe keeps the activations of all M microbatches, 1F1B at
most ``S - s`` on stage ``s`` (0-based). So 1F1B is never slower and never larger; GPipe is kept
as an option because it is what one would write first and what codegen can always run.

The cut positions are found by an exact dynamic program over (stages used, last position) that
minimizes the bottleneck stage time subject to every stage fitting in memory: O(S * n^2) work,
vectorized over the first stage boundary with numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from autopar.core.schedules import FLAT_SCHEDULES, SCHEDULES, rounds  # noqa: F401


@dataclass
class StageCosts:
    """The graph priced for stages of ``devices`` devices running ``microbatches`` microbatches."""

    devices: int
    microbatches: int
    time: np.ndarray  # [n] per-microbatch forward+backward time of each node (incl. its intra-stage edges)
    sync: np.ndarray  # [n] once-per-step time of each node (gradient all-reduce)
    static_memory: np.ndarray  # [n] bytes per device held all step (params, grads, optimizer state)
    activation_memory: np.ndarray  # [n] bytes per device saved per microbatch in flight
    cut_time: np.ndarray  # [n-1] per-microbatch send+recv time of what crosses a cut after position i


@dataclass
class PipelineSolution:
    stages: list[tuple[int, int]]  # [start, end) positions in topological order
    devices: int  # per stage
    microbatches: int
    schedule: str  # "1f1b" or "gpipe"
    cost: float  # predicted step time
    stage_time: list[float]  # per-microbatch time of each stage
    memory: list[float]  # peak bytes per device of each stage
    sync: list[float] = field(default_factory=list)  # each stage's gradient sync, once per step
    peaks: list[float] = field(default_factory=list)  # each stage's peak with its transient, where priced apart


# the schedules' bubbles: ``core.schedules`` (one formula for both planning paths and the report)


def step_time(stage_time: list[float], sync: list[float], microbatches: int, schedule: str = "1f1b") -> float:
    return rounds(schedule, microbatches, len(stage_time)) * max(stage_time) + max(sync)


def in_flight(schedule: str, stage: int, stages: int, microbatches: int) -> int:
    """Microbatches whose activations stage ``stage`` holds at its peak (1F1B with fewer
    microbatches than stages runs in GPipe's order: ``codegen.pipeline.schedule_run``)."""
    if schedule == "gpipe" or (schedule == "1f1b" and microbatches < stages):
        return microbatches
    return min(microbatches, stages - stage)


def _segments(c: StageCosts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per segment [i, j) of positions: its time (inf unless j > i), static and activation memory."""
    n = len(c.time)
    pt = np.concatenate([[0.0], np.cumsum(c.time)])
    ps = np.concatenate([[0.0], np.cumsum(c.static_memory)])
    pa = np.concatenate([[0.0], np.cumsum(c.activation_memory)])
    cut = np.concatenate([[0.0], np.asarray(c.cut_time, dtype=float), [0.0]])  # cut[i]: boundary before i
    i = np.arange(n + 1)[:, None]
    j = np.arange(n + 1)[None, :]
    # stage [i, j): its compute, plus receiving at i and sending at j (both directions are in cut_time)
    seg_time = np.where(j > i, pt[j] - pt[i] + cut[i] + cut[j], np.inf)
    return seg_time, ps[j] - ps[i], pa[j] - pa[i]


def best_cuts(c: StageCosts, stages: int, capacity: float, schedule: str,
              segments: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> PipelineSolution | None:
    """The cut into ``stages`` contiguous stages with the smallest bottleneck that fits ``capacity``.

    ``segments``: ``_segments(c)``, when the caller prices several schedules of one option."""
    n = len(c.time)
    if stages > n:
        return None
    seg_time, seg_static, seg_acts = segments if segments is not None else _segments(c)
    pt = np.concatenate([[0.0], np.cumsum(c.time)])
    cut = np.concatenate([[0.0], np.asarray(c.cut_time, dtype=float), [0.0]])
    best = np.full((stages + 1, n + 1), np.inf)
    arg = np.zeros((stages + 1, n + 1), dtype=np.intp)
    best[0, 0] = 0.0
    cols = np.arange(n + 1)
    fitting: dict[int, np.ndarray] = {}  # in-flight count -> segment times that fit (or inf)
    cand = np.empty((n + 1, n + 1))
    for s in range(1, stages + 1):
        held = in_flight(schedule, s - 1, stages, c.microbatches)
        if held not in fitting:
            # memory only adds up, so the widest segment holds the most: when it fits, all do
            if seg_static[0, n] + held * seg_acts[0, n] <= capacity:
                fitting[held] = seg_time
            else:
                mem = seg_static + held * seg_acts
                fitting[held] = np.where(mem <= capacity, seg_time, np.inf)
        np.maximum(best[s - 1][:, None], fitting[held], out=cand)  # [i, j]
        arg[s] = np.argmin(cand, axis=0)
        best[s] = cand[arg[s], cols]
    if not np.isfinite(best[stages, n]):
        return None
    bounds = []
    end = n
    for s in range(stages, 0, -1):
        start = int(arg[s, end])
        bounds.append((start, end))
        end = start
    bounds.reverse()
    times = [float(pt[b] - pt[a] + cut[a] + cut[b]) for a, b in bounds]
    syncs = [float(np.sum(c.sync[a:b])) for a, b in bounds]
    mems = [
        float(np.sum(c.static_memory[a:b]) + in_flight(schedule, k, stages, c.microbatches)
              * np.sum(c.activation_memory[a:b]))
        for k, (a, b) in enumerate(bounds)
    ]
    return PipelineSolution(bounds, c.devices, c.microbatches, schedule,
                            step_time(times, syncs, c.microbatches, schedule), times, mems, syncs)


def search(options: list[StageCosts], total_devices: int, capacity: float = math.inf,
           schedules=("1f1b", "gpipe")) -> PipelineSolution | None:
    """The best pipeline over all stage counts (total_devices / option.devices) and microbatch counts.

    Options whose devices do not divide ``total_devices`` or give a single stage are skipped: the
    single-stage plan is the intra-operator search's, compared by the caller.
    """
    best: PipelineSolution | None = None
    for c in options:
        if total_devices % c.devices:
            continue
        stages = total_devices // c.devices
        if stages < 2:
            continue
        segments = _segments(c) if stages <= len(c.time) else None
        for schedule in schedules:
            sol = best_cuts(c, stages, capacity, schedule, segments)
            if sol is None:
                continue
            key = (sol.cost, max(sol.memory))
            if best is None or key < (best.cost, max(best.memory)):
                best = sol
    return best
