"""Pipeline schedules and their bubbles: the one step formula both planning paths price with
(``search.pipeline`` on the flat path, ``planning.step_price`` on the hierarchical one) and the
report prints.
"""

from __future__ import annotations

# Pipeline schedules (torch.distributed.pipelining's classes, codegen/pipeline.py): name ->
# (stages per rank v, the bubble as a fraction of 1F1B's (p - 1) slowest-rank microbatch times).
# 1F1B (Narayanan et al. 2021): (p - 1) t. Interleaved 1F1B, v stages per rank (same paper,
# section 2.2): (p - 1) t / v, for v times the send/recv and a little more in flight on the first
# rank. Zero bubble (Qi et al. 2024, ZB-H1, torch's ScheduleInterleavedZeroBubble on one stage per
# rank): the backward split into input and weight gradients, the weight half filling the bubble:
# (p - 1)(F + B - W) = (p - 1) t / 3 where F = B = W = t / 3 (the backward at twice the forward),
# at 1F1B's peak memory. GPipe (not listed: the hierarchical search does not weigh it) has 1F1B's
# bubble and holds every microbatch. Both planning paths price a step with ``rounds``.
SCHEDULES = {"1f1b": (1, 1.0), "zero-bubble": (1, 1.0 / 3.0), "interleaved-1f1b": (2, 0.5)}
# what the flat path's stage search weighs (one stage per rank; codegen runs each)
FLAT_SCHEDULES = ("1f1b", "gpipe", "zero-bubble")


def rounds(schedule: str, microbatches: int, stages: int, virtual: int = 0) -> float:
    """Slowest-stage microbatch times per step: ``microbatches`` and the schedule's bubble over
    ``stages`` ranks; interleaved 1F1B's is ``(p - 1) / v`` of them for any v (``virtual``)."""
    v, frac = SCHEDULES.get(schedule, (1, 1.0))
    if v > 1:
        frac = 1.0 / (virtual or v)
    return microbatches + frac * (stages - 1)


def runs_as_priced(schedule: str, zero: int, recompute) -> bool:
    """Whether codegen runs ``schedule`` with these options as ``SCHEDULES`` prices it. A stage
    under ZeRO-3 (its weights gathered again for the backward, freed by the input half) or under
    pointwise recomputation runs each microbatch's whole backward in zero bubble's input half and
    idles in the weight half: its bubble is 1F1B's, not the third zero bubble is priced at, so the
    search weighs 1F1B for it instead. Interleaved 1F1B is not generated with ZeRO-3."""
    if schedule == "zero-bubble":
        return zero < 3 and recompute != "pointwise"
    if schedule == "interleaved-1f1b":
        return zero < 3
    return True
