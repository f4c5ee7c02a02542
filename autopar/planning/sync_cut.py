"""The data-parallel sync a 1F1B or zero-bubble pipeline's ranks wait for, over every cut
(docs/bound.md, "The data-parallel sync").

Rank r waits for at least ``sync_r - window_r`` (``overlap.exposed``), its window at most
``w_r t_max`` (``overlap.window`` is linear in the rank's time; ``w_r`` grows with r, the later
ranks idling longer while the pipeline fills and drains), so a step is at least
``rounds t_max + sync_r - w_r t_max`` for every r. A rank's sync is the sync of nothing plus a
weight per unit it holds (``dp_sync`` is affine in the bytes with non-negative coefficients), so
with the pipeline at least ``pipe`` the step is at least the least, over the cuts into p stages,
of the largest ``base + sum of the stage's weights + (1 - w_r / rounds) pipe``: found exactly here
(the first ranks, which hide least, get the lightest stages)."""

from __future__ import annotations

import numpy as np


def offset_cut(weight: np.ndarray, offsets: np.ndarray) -> float:
    """The least over the cuts of ``weight`` into ``len(offsets)`` contiguous non-empty stages of
    the largest ``sum of a stage's weights + offsets[stage]`` (``inf`` with more stages than units)."""
    n, stages = len(weight), len(offsets)
    if stages > n:
        return float("inf")
    pre = np.concatenate([[0.0], np.cumsum(np.asarray(weight, dtype=float))])
    i = np.arange(n + 1)[:, None]
    j = np.arange(n + 1)[None, :]
    seg = np.where(j > i, pre[j] - pre[i], np.inf)  # stage [i, j)
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    for s in range(stages):
        best = np.min(np.maximum(best[:, None], seg + float(offsets[s])), axis=0)
    return float(best[n])


__all__ = ["offset_cut"]
