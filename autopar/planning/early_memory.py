"""A memory floor of a hierarchical candidate before its tensor group is built (docs/bound.md).

``space_bound.memory_floor`` reads the candidate's group: per node, the least activations any
config of the group's space saves. Building a group (its tables and its DP) costs a fifth of a
second on a large model, and most candidates that reach it fit no layout (on DeepSeek-V3's 2048
GPUs, 36k of the 61k candidates the search bounds with it, nearly all with an expert degree), so the search first asks this floor,
which needs only the unsplit graph at the whole batch (``Search.whole_stats``, one group per
recomputation mode, built once).

Per microbatch, a data rank's share of the batch is 1/(d m) of it, and a tensor group of t ranks
(times k context ranks) splits each saved tensor at most t k ways, so a device saves at least
the unsplit activations over d m t k (as ``memory_floor`` bounds a context rank's). Summed over
the p ranks of a pipeline every unit is held by one rank, and each rank holds at least its
fewest microbatches in flight (``step_price.in_flight``): the fullest rank holds at least the
average, ``static + h A / p``, ``static`` being the perfectly sharded state per device
(``step_bounds.lower_bound``): with ``s_w`` the state of rank w, ``sum s_w >= p static`` and
``X >= s_w + h_w a_w`` for every w give ``p X >= p static + h sum a_w``. Expert parallelism
moves the routed tokens, not their count: the graph's expert nodes count the routed rows
(``planning/routed.py``), and the price keeps the group's activations at every expert degree
(``step_price.expert_split`` divides only the experts' state)."""

from __future__ import annotations

import numpy as np

from autopar.planning.step_price import Candidate, in_flight


def early_memory_floor(search, c: Candidate, static: float) -> float:
    """Bytes the fullest rank of every layout of ``c`` holds at least (module docstring)."""
    deg = c.degrees
    acts = float(np.sum(search.whole_stats(c.recompute).acts)) / (deg.d * c.microbatches * deg.t * deg.c)
    held = min(in_flight(c, w) for w in range(deg.p))
    return static + held * acts / deg.p
