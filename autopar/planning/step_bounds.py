"""Lower bounds on a hierarchical candidate's step price, for the search's branch and bound:
whole-model totals (``Totals``), compute at peak with the pipeline's bubble and perfectly
sharded state (``lower_bound``), a bound from the group's optimum at a larger microbatch
(``reference_bound``), one without cutting the pipeline (``stats_bound``) and one under any
tensor-group layout (``layout_bound``). Each holds for every plan of its candidate; why is in
each docstring and in docs/bound.md."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from autopar.core.blocks import repeated_blocks
from autopar.core.cluster import Cluster
from autopar.core.ir import Graph, trainable
from autopar.core.selective import rerun_flops as pointwise_rerun
from autopar.core.strategy import RECOMPUTE_ATTENTION, RECOMPUTE_POINTWISE
from autopar.cost_models.causal_exchange import least_work_factor
from autopar.cost_models.memory import optimizer_states
from autopar.cost_models.training import accumulation_time, optimizer_step_time
from autopar.planning.activations import attention_flops
from autopar.planning.routed import ExpertStats, expert_totals
from autopar.planning.every import every_of
from autopar.planning.overlap import window
from autopar.planning.step_price import (Candidate, accumulated, all_to_all_time, data_groups, dp_sync,
                                         expert_degrees, expert_split, level_link, pipeline_level, rerun_share,
                                         rerun_units, zero_factors)
from autopar.planning.units import UnitStats


@dataclass(frozen=True)
class Totals:
    """Whole-model figures the lower bounds need (per step, at the global batch)."""

    train_flops: float  # forward x (1 + backward factor)
    forward_flops: float  # what recomputation runs again: the repeated blocks' forward
    param_bytes: float  # parameters in their (compute) dtype, each once
    numel: float
    expert_bytes: float = 0.0  # the routed experts' part of param_bytes
    expert_numel: float = 0.0
    attention_flops: float = 0.0  # what attention-only recomputation runs again (``activations.py``)
    block_flops: tuple[float, ...] = ()  # each repeated block's forward (every k-th runs again: every.py)
    pointwise_flops: float = 0.0  # what pointwise recomputation runs again (``core/selective.py``)


def rerun_flops(c: Candidate, tot: Totals) -> float:
    """FLOPs a step runs again for the candidate's recomputation."""
    if c.recompute == RECOMPUTE_ATTENTION:
        return tot.attention_flops
    if c.recompute == RECOMPUTE_POINTWISE:
        return tot.pointwise_flops
    if every_of(c.recompute):  # blocks 0, k, 2k, ...
        return float(sum(tot.block_flops[::every_of(c.recompute)]))
    return tot.forward_flops if c.recompute else 0.0


def lower_bound(c: Candidate, tot: Totals, cluster: Cluster, peak: float, eff: float, optimizer: str | None,
                master: bool, itemsize: int) -> tuple[float, float, float]:
    """(compute part, the rest, bytes per device) no plan of this candidate can beat: compute at
    peak on every device with the pipeline's bubble, and the gradients' accumulation; the
    optimizer step of perfectly sharded state (the data-parallel sync may hide under compute: 0);
    the memory of perfectly sharded state (activations left out)."""
    deg, m = c.degrees, c.microbatches
    flops = tot.train_flops + rerun_flops(c, tot)
    per = deg.t * deg.p
    g, _, _, _ = data_groups(deg, c.zero_inner)
    ep = deg.ep if tot.expert_bytes else 1
    xb, xn = (tot.expert_bytes, tot.expert_numel) if ep > 1 else (0.0, 0.0)
    rest = 0.0  # the data-parallel sync may hide under compute (overlap.py): at least 0
    fp, fg, fo = zero_factors(c.zero, g)
    ge, _, _, _ = data_groups(expert_degrees(deg), c.zero_inner)
    efp, efg, efo = (ep * f for f in zero_factors(c.zero, ge))
    compute = c.rounds * flops / m / (cluster.devices * peak * eff) + accumulation_lb(c, tot, cluster)
    states = optimizer_states(optimizer)
    rest += optimizer_step_time((tot.numel - xn) / per / fo, itemsize, states, master, cluster.memory_bandwidth,
                                foreach=cluster.foreach_update)
    opt_bytes = (states * 4 + (4 if master else 0))
    mem = ((tot.param_bytes - xb) / fp + (tot.param_bytes - xb) / fg + (tot.numel - xn) * opt_bytes / fo) / per
    if ep > 1:
        rest += optimizer_step_time(xn / per / efo, itemsize, states, master, cluster.memory_bandwidth,
                                    foreach=cluster.foreach_update)
        mem += (xb / efp + xb / efg + xn * opt_bytes / efo) / per
    return compute, rest, mem


def accumulation_lb(c: Candidate, tot: Totals, cluster: Cluster) -> float:
    """Seconds of a step's gradient accumulation no plan of ``c`` beats: the slowest rank adds at
    least the average rank's gradients per microbatch (each parameter once, in its dtype, sharded
    over the tensor and pipeline ranks and ZeRO's group), ``rounds`` times
    (``step_price.accumulated``)."""
    deg = c.degrees
    g, _, _, _ = data_groups(deg, c.zero_inner)
    ep = deg.ep if tot.expert_bytes else 1
    xb = tot.expert_bytes if ep > 1 else 0.0
    _, fg, _ = zero_factors(c.zero, g)
    ge, _, _, _ = data_groups(expert_degrees(deg), c.zero_inner)
    efg = ep * zero_factors(c.zero, ge)[1]
    grads = ((tot.param_bytes - xb) / fg + (xb / efg if ep > 1 else 0.0)) / (deg.t * deg.p)
    return c.rounds * float(accumulation_time(grads, c.microbatches, cluster.memory_bandwidth))


def hidden_share(c: Candidate) -> float:
    """The most of ``c``'s pipeline ``rounds x t_max`` that any rank's data-parallel sync can hide
    under (``overlap.window`` at ``t_max``, the largest drain and fill idle the ranks get), as a
    share: rank r waits for ``sync_r - window_r`` at least, so a step takes at least
    ``sync_r + (1 - hidden_share) x pipeline`` (the window is linear in the rank's time)."""
    bubble = c.rounds - c.microbatches
    # the window grows with the rank's idle, min(r / v, bubble): the last rank's is the largest
    most = window(c.zero, c.microbatches, 1.0, c.degrees.p - 1, c.virtual, bubble, rerun_share(c))
    return min(most / c.rounds, 1.0)


def step_floor(c: Candidate, pipe: float, bucket: float, sync: float, rest: float) -> float:
    """A floor on ``c``'s price from floors of its pipeline (``rounds x t_max``), its first rank's
    last bucket and some rank's data-parallel sync: the price is the pipeline plus the slowest
    exposed sync plus the optimizer step (``rest``), each exposed sync at least its last bucket
    and at least ``sync_r - window_r`` (``hidden_share``)."""
    return max(pipe + bucket, sync + (1.0 - hidden_share(c)) * pipe) + rest


def sync_lb(c: Candidate, tot: Totals, cluster: Cluster, comp: float = 0.0) -> float:
    """Seconds of the data-parallel sync some rank of every plan of ``c`` runs: the sync is affine
    in the bytes with non-negative coefficients (``dp_sync``), so the slowest rank's is at least
    that of the average rank's gradients and parameters (each once, sharded over the tensor and
    pipeline ranks; context ranks hold the group's whole), and a step is at least any rank's
    whole sync plus its optimizer step (``space_bound.sync_floors``). 0 with expert degrees (their
    own groups); ``max(compute, sync_lb) + rest`` bounds the step before any group is solved,
    ``comp`` a floor of the pipeline: the part of it the sync cannot hide under is added
    (``step_floor``)."""
    deg = c.degrees
    if deg.ep > 1 or deg.d * deg.c == 1:
        return 0.0
    per = tot.param_bytes / (deg.t * deg.p)
    sync = float(dp_sync(c.zero, per, per, c.microbatches, cluster, deg, c.zero_inner))
    return sync + (1 - hidden_share(c)) * comp


def reference_bound(c: Candidate, group_time: float, b_ref: int, b: int, compute_lb: float, rest_lb: float
                    ) -> float:
    """A bound from the group's least time at a larger microbatch ``b_ref`` (over every layout:
    ``least_time``): the least per-microbatch time ``T(b)`` of any layout has ``T(b)/b``
    non-increasing in b (each term is affine in b with a non-negative constant: latencies,
    weights read), so ``T(b) >= b/b_ref T(b_ref)``, and the slowest of p stages takes at least
    ``T(b)/p``."""
    return max(compute_lb, c.rounds / c.degrees.p * group_time * b / b_ref) + rest_lb


def stats_bound(c: Candidate, s: UnitStats, cluster: Cluster, optimizer: str | None, master: bool,
                itemsize: int, experts: ExpertStats | None = None) -> float:
    """A lower bound on ``price(c, s, ...).cost`` without cutting the pipeline: the slowest stage
    takes at least the average and at least the slowest unit; the tensor group's syncs at least
    their average, the data-parallel sync at least 0 (it may hide under compute)."""
    deg, m, p = c.degrees, c.microbatches, c.degrees.p
    s, ex, (_, efg, efo) = expert_split(c, s, experts)
    g, _, _, _ = data_groups(deg, c.zero_inner)
    _, fg, fo = zero_factors(c.zero, g)
    time = s.time + (all_to_all_time(ex, deg, cluster, rerun_units(c, s)) if ex is not None else 0.0)
    time = time + accumulated(c, s, ex, fg, efg, cluster)  # the same per unit as ``price``
    t_max = max(float(np.sum(time)) / p, float(np.max(time)))
    dp = 0.0  # the data-parallel sync may hide under compute (overlap.py): at least 0
    states = optimizer_states(optimizer)
    opt = optimizer_step_time(float(np.sum(s.numel)) / p / fo, itemsize, states, master, cluster.memory_bandwidth,
                              foreach=cluster.foreach_update)
    if ex is not None:
        opt += optimizer_step_time(float(np.sum(ex.numel)) / p / efo, itemsize, states, master,
                                   cluster.memory_bandwidth, foreach=cluster.foreach_update)
    return c.rounds * t_max + float(np.sum(s.sync)) / p + dp + opt


def layout_bound(c: Candidate, s: UnitStats, cluster: Cluster, compute_lb: float, rest_lb: float,
                 added: float = 0.0) -> float:
    """A lower bound on ``price(c, ...)`` under *any* layout of the tensor group (the space's
    layouts, not only the one its DP chose), so that it bounds the candidate's optimum.

    ``s`` holds ``T* = sum(s.time)``, the least per-microbatch time any layout takes
    (``space_bound.balanced``: not the time of the layout the group's DP chose, which weighs a
    window's middle block once where the model runs it once per middle block). With p stages
    cut at unit boundaries, the stages' per-microbatch times add up to the whole graph's plus
    each of the p - 1 cuts twice (the stages on both sides send and receive it), and a cut's
    cost does not depend on the layout (Megatron's 1/t slices of what crosses it), so the slowest
    stage takes at least ``(T* + 2 x (the p - 1 cheapest cuts)) / p``.
    The syncs inside the group are at least 0; data-parallel sync and the optimizer step at least
    ``rest_lb`` (perfectly sharded state: ``lower_bound``), and the compute at least ``compute_lb``.
    ``added``: seconds per microbatch every layout spends at least adding gradients into the held
    ones over all units (``space_bound.accumulation_floor``), on top of ``T*``."""
    deg, p = c.degrees, c.degrees.p
    total = float(np.sum(s.time)) + added
    if p > 1 and len(s.boundary):
        bw, lat = level_link(cluster, pipeline_level(deg))
        cut = np.sort(2 * (lat + cluster.call_latency + np.asarray(s.boundary, dtype=float) / bw))
        total += 2 * float(np.sum(cut[:p * c.virtual - 1]))
    return max(compute_lb, c.rounds * total / p) + rest_lb


def totals(g: Graph, backward_factor: float, least: bool = False) -> Totals:
    """The whole model's ``Totals`` (the graph at the global batch, under its training options);
    ``least``: each node's FLOPs at the least share any split runs (a causal attention's balanced
    rows: ``causal_exchange.least_work_factor``), the figures a lower bound takes."""
    seen: dict[str, tuple[int, int]] = {}  # the parameters that take a gradient and optimizer state
    for n in g.nodes:  # (not a buffer such as a rotary table: ``units.unit_stats`` gives it neither)
        for p, grad in zip(n.params, trainable(n)):
            if grad:
                seen[p.source] = (p.spec.numel, p.spec.nbytes)
    flops = [float(n.flops) * (least_work_factor(n) if least else 1.0) for n in g.nodes]
    fwd = float(sum(flops))
    # what recomputation re-runs: the repeated blocks' forward (not the embedding's or the head's)
    inside = {i for b in repeated_blocks(g) for i in b.nodes}
    rerun = float(sum(flops[i] for i in inside))
    out = Totals((1 + backward_factor) * fwd, rerun, float(sum(b for _, b in seen.values())),
                 float(sum(k for k, _ in seen.values())), *expert_totals(g))
    blocks = tuple(float(sum(flops[i] for i in b.nodes)) for b in repeated_blocks(g))
    return dataclasses.replace(out, block_flops=blocks, pointwise_flops=pointwise_rerun(g, inside))


def least_totals(g: Graph, backward_factor: float) -> Totals:
    """``totals`` as the compute bound counts them: every node's FLOPs at the least share any
    split runs, attention-only recomputation's included (``activations.attention_flops``)."""
    return dataclasses.replace(totals(g, backward_factor, least=True), attention_flops=attention_flops(g, least=True))
