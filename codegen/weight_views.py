"""Codegen's side of ``core.weight_views``: a replicated view of one weight whose reader gives its
gradient back as partial sums passes them on to the weight, whose gradient the reducer then sums
in its bucket (overlapped with the backward) instead of a blocking all-reduce on the edge. The
cost model prices the same pairs the same way (``cost_models/weight_view_sync.py``); the issued
collectives are checked against its list in ``tests/codegen/test_codegen_collectives.py``.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Placement

from autopar.core import layout as core
from autopar.core.ir import Node
from autopar.core.weight_views import WEIGHT_VIEW, lifted_grad_axes

from .moves import is_sum

Placements = tuple[Placement, ...]


def _core(placements: Placements) -> core.Layout | None:
    """The IR's layout of torch placements (None: a partial that is not a sum, never lifted)."""
    out = []
    for p in placements:
        if p.is_replicate():
            out.append(core.R)
        elif p.is_shard():
            out.append(core.Shard(p.dim))
        elif is_sum(p):
            out.append(core.P)
        else:
            return None
    return tuple(out)


def lifted_weight(node: Node | None, made: Placements, wanted: Placements, grads: Placements,
                  grad_of: dict[str, Placements], canonical: dict[str, str], model: nn.Module) -> str | None:
    """The weight (its state name) to which the reader's partial gradient of ``node``'s output
    goes on, or None where the edge reshards it as usual: where ``core.weight_views.lifted_grad_axes``
    lifts some axis (the rule the cost model prices), and the weight is a parameter that takes a
    gradient, stored replicated."""
    if node is None or WEIGHT_VIEW not in node.attrs:
        return None
    layouts = [_core(x) for x in (made, wanted, grads)]
    if None in layouts or not lifted_grad_axes(node, *layouts):
        return None
    name = node.attrs[WEIGHT_VIEW].removeprefix("param:")
    name = canonical.get(name, name)
    if name not in grad_of or not all(p.is_replicate() for p in grad_of[name]):
        return None
    try:
        return name if model.get_parameter(name).requires_grad else None
    except AttributeError:  # a buffer: no gradient to pass on
        return None
