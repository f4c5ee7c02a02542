"""What a node's backward holds beside the saved activations: the gradients it reads and makes.

When autograd runs a node's backward it holds the gradient of the node's outputs (what reached
it) and writes the gradients of its inputs that take one and of its trainable parameters, all
alive together, each the size and layout of its tensor on the device. At that moment the saved
activations of the nodes before it (and its own) are still alive; those after it are freed. So
the backward's peak over a run of nodes is the largest, over its nodes ``n``, of the activations
saved up to ``n`` plus ``n``'s gradients: where a node's gradients are large beside what is
saved (an attention whose heads are not split makes gradients of its whole query, key and value),
that peak is above the saved activations at the backward's start, which is all the sum of saved
activations counts.

An op that saves nothing (an add, a view, a split) hands its output's gradient on as its
inputs' (the same tensor or a view of it): it holds only that. Gradients of tensors that take
none (masks, position tables, integer indices) are never made.

A loss's backward has its own working set (``memory.LOSS_GRADIENTS``, counted by its node): the
excess here is taken beside it, not added to it.
"""

from __future__ import annotations

from autopar.core.backward import needs_grad
from autopar.core.ir import FLOAT_DTYPES, Node, trainable
from autopar.core.layout import NodeLayouts, shard_factor
from autopar.core.tables import Mesh
from autopar.cost_models.memory import saves_for_backward

__all__ = ["needs_grad", "node_gradients", "backward_excess"]


def node_gradients(node: Node, lay: NodeLayouts, mesh: Mesh, grad: set[str]) -> float:
    """Bytes per device of the gradients alive while ``node``'s backward runs (``grad``: the
    nodes whose outputs take a gradient, ``needs_grad``); 0 for a node autograd runs no backward for."""
    if node.name not in grad:
        return 0.0
    outs = sum(spec.nbytes / shard_factor(pl, mesh) for spec, pl in zip(node.outputs, lay.outputs)
               if spec.dtype in FLOAT_DTYPES)
    if not saves_for_backward(node):  # its inputs' gradients are its output's, handed on
        return float(outs)
    ins = sum(op.spec.nbytes / shard_factor(pl, mesh) for op, pl in zip(node.inputs, lay.inputs)
              if op.is_node and op.source in grad and op.spec.dtype in FLOAT_DTYPES)
    params = sum(op.spec.nbytes / shard_factor(pl, mesh)
                 for op, pl, g in zip(node.params, lay.params, trainable(node)) if g)
    return float(outs + ins + params)


def backward_excess(saved: list[float], gradients: list[float]) -> float:
    """For nodes in forward order with the bytes each saves and its backward's gradients: how far
    the backward's peak over them rises above all their saved activations (>= 0)."""
    total, running, worst = sum(saved), 0.0, 0.0
    for s, g in zip(saved, gradients):
        running += s
        worst = max(worst, running + g - total)
    return worst
