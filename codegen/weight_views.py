"""Codegen's side of ``core.weight_views``: a replicated view of one weight whose reader gives its
gradient back as partial sums passes them on to the weight, whose gradient the reducer then sums
in its bucket (overlapped with the backward) instead of a blocking all-reduce on the edge. The
cost model prices the same pairs the same way (``cost_models/weight_view_sync.py``); the issued
collectives are checked against its list in ``tests/codegen/test_codegen_collectives.py``.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Placement

from autopar.core.ir import Node
from autopar.core.weight_views import WEIGHT_VIEW

from .moves import is_sum

Placements = tuple[Placement, ...]


def lifted_weight(node: Node | None, made: Placements, wanted: Placements, grads: Placements,
                  grad_of: dict[str, Placements], canonical: dict[str, str], model: nn.Module) -> str | None:
    """The weight (its state name) to which the reader's partial gradient of ``node``'s output
    goes on, or None where the edge reshards it as usual. As ``core.weight_views.lifted_grad_axes``:
    ``node`` is a weight view, ``made`` replicated and read as it is (``wanted``), the reader's
    ``grads`` replicated or a partial sum on every axis and partial on some; and the weight is a
    parameter that takes a gradient, stored replicated."""
    if node is None or WEIGHT_VIEW not in node.attrs or wanted != made:
        return None
    if not all(p.is_replicate() for p in made):
        return None
    if not all(g.is_replicate() or is_sum(g) for g in grads) or all(g.is_replicate() for g in grads):
        return None
    name = node.attrs[WEIGHT_VIEW].removeprefix("param:")
    name = canonical.get(name, name)
    if name not in grad_of or not all(p.is_replicate() for p in grad_of[name]):
        return None
    try:
        return name if model.get_parameter(name).requires_grad else None
    except AttributeError:  # a buffer: no gradient to pass on
        return None
