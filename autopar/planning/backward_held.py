"""What a pipeline rank's backward holds beside its saved activations and its static state.

* The outputs of each of its stages but the last, kept for the backward of every microbatch in
  flight (torch's schedule calls the backward on a stage's outputs, so it keeps them from the
  microbatch's forward to its backward), in the layout the stage sends them (codegen's
  ``Boundary``), and the gradient received for them while that backward runs.
* How far one node's gradients rise above what is saved up to it (``UnitStats.backward``,
  ``cost_models/backward_set.py``): an attention whose heads are whole on every rank of its
  tensor group makes whole gradients of its query, key and value. Counted on the ranks of a
  pipeline that hold no loss: one whose backward starts at a loss has its peak there, with every
  activation alive and the loss's working set (``UnitStats.transient``, in its static state), as
  a single-stage plan's is priced on both paths.
"""

from __future__ import annotations

import numpy as np

from autopar.core.layout import node_layouts, to_mesh
from autopar.cost_models.backward_set import needs_grad, node_gradients
from autopar.cost_models.memory import LOSS_GRADIENTS
from autopar.planning.units import UnitStats


def beside_saved(s: UnitStats, ranks: list[list[tuple[int, int]]], held: list[float]) -> list[float]:
    """Per rank (its stages' unit spans ``ranks[r]``, ``held[r]`` microbatches in flight: the
    pricing's ``in_flight``), the bytes its backward holds beside the saved activations."""
    U = len(s.spans)
    out = []
    for r, spans in enumerate(ranks):
        each = held[r] / len(spans) + 1.0  # the outputs in flight, and the gradient received for one
        sent = sum(float(s.sent[y - 1]) * each for _, y in spans if y < U) if s.sent is not None else 0.0
        rise = max((float(np.max(s.backward[x:y])) for x, y in spans), default=0.0) if s.backward is not None else 0.0
        loss = sum(float(np.sum(s.transient[x:y])) for x, y in spans) if s.transient is not None else 0.0
        out.append(sent + (rise if loss == 0 and len(ranks) > 1 else 0.0))
    return out


def held_floors(boundary: np.ndarray, held: list[float], stages_per_rank: int,
                rise: np.ndarray | None = None) -> np.ndarray:
    """Per rank of a pipeline (``held[r]`` microbatches in flight), bytes every layout's rank holds
    beside its saved activations at least (``beside_saved``'s stage outputs): rank r runs stages
    r, r + p, ... (``step_price.interleaved_cuts``), so every rank but the last, which runs the
    model's last stage, sends at all its ``v`` stages' cuts, the last at ``v - 1``; each cut's
    outputs are at least the tensors crossing it over the group's devices (``boundary``: no
    layout splits a tensor over more), held ``h / v + 1`` times. ``rise``: per unit, the least
    rise of one node's gradients any layout makes there (``rise_floors``; None where some rank
    but the last may hold a loss): every rank but the last holds ``v`` units or more but the
    model's last (one a stage), so it rises at least the ``v``-th least of their floors, rank 0,
    which runs the first unit, at least that unit's too. Zeros on one stage."""
    p, v = len(held), stages_per_rank
    if p <= 1 or not len(boundary):
        return np.zeros(p)
    least = float(np.min(boundary))
    out = np.asarray([(v - (r == p - 1)) * (h / v + 1.0) * least for r, h in enumerate(held)])
    if rise is not None and len(rise) > v:
        least = float(np.sort(rise[:-1])[v - 1])
        out[:-1] += least
        out[0] += max(float(rise[0]) - least, 0.0)  # rank 0 runs the first unit
    return out


def rise_floors(graph, spans: list[tuple[int, int]], configs: list, mesh) -> np.ndarray | None:
    """Per unit (``spans`` of ``graph`` at the microbatch, ``configs`` per node, on the tensor
    group's ``mesh``), the least over configs of its last node's gradients: the backward's rise
    over the unit is at least that node's (``backward_set.backward_excess``: nothing is saved after
    it). None where a loss lies outside the last unit (a rank holding it rises none)."""
    if any(graph.nodes[i].op in LOSS_GRADIENTS for a, b in spans[:-1] for i in range(a, b)):
        return None
    grad = needs_grad(graph)
    return np.asarray([min(node_gradients(graph.nodes[b - 1], node_layouts(graph.nodes[b - 1], to_mesh(cfg, mesh), mesh),
                                          mesh, grad) for cfg in configs[b - 1]) for _, b in spans])
