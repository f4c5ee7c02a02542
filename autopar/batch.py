"""Which dim of each node is the batch dim: the basis of the data-parallel baseline.

The first axis of every graph input is a batch axis. A node dim that indexes a batch axis of one of
its data inputs (as the major dim of a merged axis, so ``view(b*s, v)`` keeps ``b``) is a batch dim,
and every output axis whose major dim is a batch dim is a batch axis for the consumers. Parameters
never carry the batch. The propagation is a single pass in topological order.
"""

from __future__ import annotations

from autopar.ir import Graph, Node


def batch_dims(graph: Graph) -> dict[str, str | None]:
    """Node name -> the name of its batch dim (None where the node has none)."""
    batch_axes: dict[tuple[str, int], set[int]] = {}  # (source, output) -> batch axes of that tensor
    for name, spec in graph.inputs.items():
        if len(spec.shape) >= 1:
            batch_axes[(f"input:{name}", 0)] = {0}
    result: dict[str, str | None] = {}
    for node in graph.nodes:
        dim = _batch_dim_of(node, batch_axes)
        result[node.name] = dim
        for j, out in enumerate(node.outputs):
            axes = {i for i, a in enumerate(out.axes) if dim is not None and a[:1] == (dim,)}
            if axes:
                batch_axes[(node.name, j)] = axes
    return result


def _batch_dim_of(node: Node, batch_axes: dict[tuple[str, int], set[int]]) -> str | None:
    for op in node.inputs:
        for i in sorted(batch_axes.get((op.source, op.output), ())):
            if i < len(op.spec.axes) and op.spec.axes[i]:
                name = op.spec.axes[i][0]
                if not node.dim(name).reduction:
                    return name
    return None
