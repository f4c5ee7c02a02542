"""The wait a blocking collective absorbs: the ranks drift apart over the compute since they last met.

Every rank of a step runs the same compute between two collectives, but not in the same time:
one is interrupted, another's cache is colder. The first collective after a segment returns only
once the slowest rank has reached it, so a step pays, per segment, the slowest rank's compute,
not the average one the profile prices: ``E[max_r t_r] - E[mean_r t_r]``, the segment's
*spread* ``W(S)``. The collective fits (``collective_fit.fit_collectives``) time each collective
after a few milliseconds of work, so they already hold ``W`` of that gap; what they miss is the
rest of a longer segment. On 2 gloo ranks of the benchmarks' machine (benchmarks/README.md) a
collective inside a real step measured 0.95x its 4 ms fit after 0.5 ms of compute and 2.2-5.5x
after 12-49 ms (a loaded host): a tensor-parallel plan's all-reduce after a whole attention is
priced as if the ranks had met one matmul before.

``fit_spread`` measures ``W`` on the live group, the same segment on every rank after a barrier,
at two lengths, and keeps it as a power law ``W(S) = w * (S / long) ** power`` (``Spread``): the
spread grows in proportion to the segment where a rank's speed changes slower than the segment
(``power`` 1) and as its square root where it averages out over it (``power`` 0.5); the two
measured lengths say which. ``segment_waits`` walks one plan's step in execution order (the
forward in graph order, each reshard before the node that reads it, the backward in reverse,
each gradient's reshard after the node that makes it, the gradient buckets at the backward's end,
the step's end where the ranks meet again) and adds, per meeting, ``W(segment) - W(priced gap)``:
the wait beyond what the collective's fit already holds. It is a plan-level term: the search's
per-edge tables do not see it (a segment ends at whichever edge reshards next, which only the
whole plan says).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

SPREAD_SHORT_S = 4e-3  # the two segment lengths ``fit_spread`` times (the collective fit's gap, and 8x)
SPREAD_LONG_S = 32e-3


@dataclass(frozen=True)
class Spread:
    """``W(S) = wait * (S / long) ** power``: seconds the slowest rank is behind the mean after
    ``S`` seconds of compute since the ranks met."""

    wait: float  # W at ``long``, s
    long: float = SPREAD_LONG_S
    power: float = 1.0  # clamped to [0.5, 1]

    def __call__(self, seconds: float) -> float:
        if seconds <= 0 or self.wait <= 0:
            return 0.0
        return self.wait * (seconds / self.long) ** self.power


def spread_of(times) -> float:
    """Per round (a list of every rank's seconds for the same work): the slowest rank's time
    less the ranks' mean; averaged over the rounds (a step pays the mean)."""
    return statistics.fmean(max(r) - statistics.fmean(r) for r in times)


def spread_line(short: tuple[float, float], long: tuple[float, float]) -> Spread:
    """The power law through ``(segment seconds, W)`` at the two lengths, ``power`` clamped to
    [0.5, 1] (what independent and what persistent slowdowns give), anchored at the long one."""
    import math

    (s0, w0), (s1, w1) = short, long
    if w1 <= 0:
        return Spread(0.0, max(s1, 1e-9))
    power = math.log(w1 / w0) / math.log(s1 / s0) if w0 > 0 and s1 > s0 else 1.0
    return Spread(w1, s1, min(1.0, max(0.5, power)))


def fit_spread(device: str = "cpu", lengths=(SPREAD_SHORT_S, SPREAD_LONG_S), repeats: int = 15,
               work: str = "mixed", segment=None) -> Spread | None:
    """``Spread`` of the live group through the first and last of ``spread_points`` (None without
    a group of two or more ranks). Every rank must call it."""
    points = spread_points(device, lengths, repeats, work, segment)
    return spread_line(points[0], points[-1]) if points else None


def spread_points(device: str = "cpu", lengths=(SPREAD_SHORT_S, SPREAD_LONG_S), repeats: int = 15,
                  work: str = "mixed", segment=None) -> list[tuple[float, float]]:
    """``(S, W)`` per length on the live group ([] without one). Per length: ``repeats`` rounds,
    each a barrier then the same work on every rank (``compute_segment``, or ``segment(seconds)``
    where given: a test's injected skew), each rank's wall time all-gathered; ``S`` is the ranks'
    mean time, ``W`` its ``spread_of``."""
    import time

    import torch
    import torch.distributed as dist
    from autopar.cost_models.collective_fit import compute_segment

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return []
    threads = torch.get_num_threads()
    if torch.device(device).type == "cpu":
        torch.set_num_threads(1)  # as the profile times each op
    points = []
    try:
        for seconds in lengths:
            seg = segment(seconds) if segment is not None else compute_segment(seconds, device, work)
            seg()  # first-call costs
            mine = []
            for _ in range(repeats):
                dist.barrier()
                t = time.perf_counter()
                seg()
                if torch.device(device).type == "cuda":
                    torch.cuda.synchronize()  # a CUDA segment's kernels, finished
                mine.append(time.perf_counter() - t)
            got = [torch.zeros(repeats, dtype=torch.float64, device=device) for _ in range(dist.get_world_size())]
            dist.all_gather(got, torch.tensor(mine, dtype=torch.float64, device=device))
            rounds = [[float(g[i]) for g in got] for i in range(repeats)]
            points.append((statistics.fmean(statistics.fmean(r) for r in rounds), spread_of(rounds)))
    finally:
        torch.set_num_threads(threads)
    return points


@dataclass(frozen=True)
class Meeting:
    """One point of a step where the ranks meet: after ``segment`` seconds of compute, the first
    collective there (``what``) priced on a fit after ``gap`` seconds; ``wait`` is the spread
    beyond the fit's."""

    phase: str
    what: str
    segment: float
    gap: float
    wait: float


@dataclass
class SegmentWaits:
    """``segment_waits``' answer: the extra seconds per step and the meetings they come from."""

    seconds: float = 0.0
    meetings: list[Meeting] = field(default_factory=list)


def _compute(model, node, cfg, cluster, mode: str) -> tuple[float, float, float]:
    """(forward, backward, optimizer) seconds ``model`` prices ``node`` at under ``cfg``."""
    fwd = bwd = opt = 0.0
    for t in model.node_breakdown(node, cfg, cluster, mode, text=False).terms:
        if t.kind == "optimizer":
            opt += t.seconds
        elif t.kind == "compute":
            if "backward" in t.label or "again" in t.label:
                bwd += t.seconds
            else:
                fwd += t.seconds
    return fwd, bwd, opt


def _gap(model, item, graph, assignment, cluster) -> float:
    """The compute before it that the fit pricing ``item`` assumed (``ProfiledModel.edge_cost``:
    an edge's reshard between the near and far fit by the node just before it; the rest far)."""
    far, near = model.comm_gap, model.near_gap
    if item.where == "experts" and model.near is not None:
        return near
    if item.where != "edge" or model.near is None or near is None:
        return far
    src = graph.node(item.tensors[0].split(" -> ")[0].rsplit(":", 1)[0])
    before = src if item.phase == "forward" else graph.node(item.node)
    w = model.near_weight(before, [assignment[before.name]], cluster, backward=item.phase == "backward")
    return near + float(w[0]) * (far - near)


def segment_waits(graph, assignment: dict, model, cluster, mode: str = "train") -> SegmentWaits:
    """The waits of ``assignment``'s step beyond its priced collectives (see the module
    docstring); zero where ``model`` has no ``spread`` of a live group of ``cluster``'s size."""
    from autopar.cost_models.collectives import predicted_collectives

    spread = getattr(model, "spread", None)
    out = SegmentWaits()
    if spread is None or model.comm is None or model.comm.world != cluster.devices or spread.wait <= 0:
        return out
    cfg = dict(assignment)
    items = predicted_collectives(graph, cfg, model.comm_cluster(cluster), mode, model=model).items
    train = mode == "train"
    seg = 0.0

    def meet(phase: str, found) -> None:
        nonlocal seg
        if not found:
            return
        gap = _gap(model, found[0], graph, cfg, cluster) if found[0] is not None else 0.0
        wait = max(0.0, spread(seg) - spread(gap))
        out.meetings.append(Meeting(phase, found[0].where if found[0] is not None else "step end", seg, gap, wait))
        out.seconds += wait
        seg = 0.0

    costs = {n.name: _compute(model, n, cfg[n.name], cluster, mode) for n in graph.nodes}
    for n in graph.nodes:
        meet("forward", [it for it in items if it.phase == "forward" and it.where == "edge" and it.node == n.name])
        seg += costs[n.name][0]
        meet("forward", [it for it in items if it.phase == "forward" and it.where not in ("edge", "output")
                         and it.node == n.name])
    meet("forward", [it for it in items if it.phase == "forward" and it.where == "output"])
    if train:
        for n in reversed(graph.nodes):
            seg += costs[n.name][1]
            meet("backward", [it for it in items if it.phase == "backward" and it.node == n.name
                              and it.where != "grad-sync"])
        meet("backward", [it for it in items if it.where == "grad-sync"])
        seg += sum(c[2] for c in costs.values())
    meet("step", [None])  # the next step's first meeting: the slowest rank's end
    return out
