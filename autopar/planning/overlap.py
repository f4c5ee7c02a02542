"""How much of a pipeline rank's data-parallel sync the step waits for, the rest hidden under compute.

DDP and FSDP launch a bucket's collective as soon as its gradients exist (and FSDP prefetches the
next unit's parameters while the current one computes), so the sync of a rank runs on the network
while the rank still computes: its exposed part is what does not fit under that compute, and at
least the last bucket (the rank's first unit, whose gradients the backward produces last), which
nothing follows. The compute a rank's collectives run under (``window``):

* gradient reduction once per step (ZeRO 0 and 1): the backward of the last microbatch;
* once per microbatch (ZeRO-2's reduce-scatters, ZeRO-3's gathers and reduce-scatters): every
  microbatch's backward (and forward, for ZeRO-3's gathers);
* ZeRO 1-2's parameter all-gather after the optimizer step: the next step's first forward;
* with pipelining, rank ``r`` finishes its last backward ``r`` stage-backwards before rank 0 (the
  backward drains from the last rank to the first; ``/ v`` with v stages per rank) and starts its
  first forward as much later: that idle time hides sync too, up to the schedule's bubble.

The backward's share of a microbatch is ``f / (1 + f)`` of its compute (``f`` the analytic
model's backward factor), ``(1 + f) / (2 + f)`` with recomputation (the forward runs again inside
the backward). The window never exceeds the pipeline's own time, so a price of
``pipeline + exposed`` is never below ``max(pipeline, sync)`` -- nor below the pipeline alone,
which is what the lower bounds keep (their sync term is 0).
"""

from __future__ import annotations

from autopar.cost_models.analytic import AnalyticModel


def backward_share(recompute: bool | float, factor: float = AnalyticModel.backward_factor) -> float:
    """The backward's share of a microbatch's compute (with the recomputed forward inside it);
    a float ``recompute``: the share of the forward run again (every k-th block: 1/k)."""
    rerun = recompute if isinstance(recompute, float) else (1.0 if recompute else 0.0)
    return (factor + rerun) / (factor + 1.0 + rerun)


def window(zero: int, microbatches: int, t: float, rank: int, virtual: int, bubble: float,
           recompute: bool | float) -> float:
    """Seconds of rank ``rank``'s compute its data-parallel collectives can run under, ``t`` its
    time per microbatch, ``bubble`` the schedule's bubble in microbatch times."""
    share = backward_share(recompute)
    back, fwd = share * t, (1.0 - share) * t
    slack = min(rank / virtual, bubble)  # drain (end) and fill (start) idle, stage-microbatches
    if zero >= 3:
        return (microbatches + slack) * t
    out = (microbatches if zero == 2 else 1) * back + slack * back
    if zero >= 1:  # the parameters' all-gather, under the next step's first forward
        out += (1.0 + slack) * fwd
    return out


def exposed(sync: float, last_bucket: float, overlap_window: float) -> float:
    """The part of ``sync`` the step waits for: what does not fit under the window, and at
    least the last bucket (nothing computes after it)."""
    return max(min(last_bucket, sync), sync - overlap_window)
