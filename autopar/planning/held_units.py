"""A floor on the slowest pipeline rank from how many units some rank must hold (docs/bound.md,
"Whole units").

The balanced floor (``step_bounds.layout_bound``) divides the model's time evenly over the ``p``
ranks; cuts fall between units, so a rank holds whole units: 128 blocks over 24 ranks put 6 on
one of them, not 5.33. Of the ``k`` units with the largest time floors some rank holds at least
``ceil(k / p)``, and each of them takes at least its floor, so that rank takes at least the sum of
the ``ceil(k / p)`` least of those ``k`` floors, for every ``k``. With ``p > 1`` each of its ``v``
stages sends and receives at its two cuts but the model's first and last stage, which are on
different ranks: at least ``2 v - 1`` cut crossings, each at least the cheapest cut
(``step_price.cut_times``: fixed by what crosses, whatever the layout). Interleaved schedules
have no exact cut bound (``space_bound.cut_bound`` cuts 1F1B only); this one holds for every
schedule.

Memory caps the units a rank holds (``capped_floor``): rank ``w`` holds ``h_w`` microbatches of
its units' activations beside their state, so the first ranks of an interleaved schedule, which
hold the most microbatches, fit fewer units, and the later ranks must take the rest, however the
stages are cut."""

from __future__ import annotations

import math

import numpy as np


def most_held(floors: np.ndarray, ranks: int) -> float:
    """The least per-microbatch time some rank of ``ranks`` takes when each unit, whatever rank
    holds it, takes at least ``floors[u]``: the largest over ``k`` of the sum of the ``ceil(k /
    ranks)`` least of the ``k`` largest floors."""
    f = np.sort(np.asarray(floors, dtype=float))[::-1]
    if not len(f):
        return 0.0
    k = np.arange(1, len(f) + 1)
    held = -(-k // max(ranks, 1))
    cs = np.concatenate([[0.0], np.cumsum(f)])
    return float(np.max(cs[k] - cs[k - held]))


def held_floor(floors: np.ndarray, cut: np.ndarray, ranks: int, stages_per_rank: int) -> float:
    """``most_held`` plus, over several ranks, the ``2 v - 1`` cut crossings each rank makes at
    least (``cut``: per boundary, what one crossing costs a stage per microbatch)."""
    out = most_held(floors, ranks)
    if ranks > 1 and len(cut):
        out += (2 * stages_per_rank - 1) * float(np.min(cut))
    return out


def fitting_count(costs: np.ndarray, room: float) -> int:
    """The most units one rank can hold when unit ``u`` takes at least ``costs[u]`` bytes there and
    it has ``room``: the largest ``k`` whose ``k`` cheapest units fit."""
    return int(np.searchsorted(np.cumsum(np.sort(np.asarray(costs, dtype=float))), room, side="right"))


def capped_floor(floors: np.ndarray, caps: list[int], cut: np.ndarray, stages_per_rank: int) -> float:
    """The least per-microbatch time some rank takes when rank ``w`` holds at most ``caps[w]`` of the
    units (its memory: ``fitting_count``) and each unit takes at least ``floors[u]``: every unit is
    on some rank, so with ``L`` the least count with ``sum_w min(L, caps[w])`` at least the units,
    some rank holds ``L`` of them or more, and takes at least the sum of the ``L`` least floors and
    its ``2 v - 1`` cut crossings (``held_floor``). ``math.inf`` when the caps cannot hold every unit
    (no cut fits)."""
    n, caps = len(floors), np.asarray(caps)
    if int(np.sum(caps)) < n:
        return math.inf
    held = max(-(-n // max(len(caps), 1)), 1)
    while int(np.sum(np.minimum(caps, held))) < n:
        held += 1
    out = float(np.sum(np.sort(np.asarray(floors, dtype=float))[:held]))
    if len(caps) > 1 and len(cut):
        out += (2 * stages_per_rank - 1) * float(np.min(cut))
    return out


__all__ = ["capped_floor", "fitting_count", "held_floor", "most_held"]
