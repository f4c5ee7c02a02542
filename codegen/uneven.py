"""A batch the plan's data-parallel degree does not divide: uneven shards of the batch.

The last batch of an epoch (``DataLoader(drop_last=False)``) is smaller than the others, and its
size need not divide into the mesh axes that cut the batch. Each rank then holds the rows
``torch.distributed.tensor`` gives it for ``Shard(0)`` of the whole batch (``torch.chunk``'s sizes:
ceil-sized chunks first, trailing ones possibly smaller or empty), on every node whose batch dim is
cut, as ``compute_local_shape_and_global_offset`` says. A node's local shapes, means and dropout
masks follow those rows (``NodeLayout.uneven``); a mean over the batch is this rank's sum of its
rows over the whole batch's count (this rank's mean times its share), so the partial terms add up
to the single-device mean and the gradients to its gradients; a rank with no rows adds zero.

Moves of a batch-cut value go through DTensor with the whole value's shape, which pads uneven
shards itself. DTensor can cut a tensor axis only as a whole, so an axis that merges the batch with
another dim (``view(b * s, d)``) cannot be moved while it is cut unevenly: such a plan refuses the
uneven batch in one line (its nodes compute on such axes locally; only a move of one is refused).
"""

from __future__ import annotations

import dataclasses

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from autopar.core.batch import batch_dims, traced_batch
from autopar.core.ir import Graph

from .placements import LayoutError, NodeLayout, Placements
from .runtime import ReshardSpec

Uneven = dict[str, tuple[int, int, int]]  # dim -> (whole batch, this rank's rows, its first row)


def uneven_batch(graph: Graph, layouts: dict[str, NodeLayout], mesh: DeviceMesh) -> dict[str, Uneven]:
    """Per node whose batch dim is cut into parts the batch does not divide evenly, this rank's
    rows of it (in rows of the whole batch, the node's dim being that many times larger where it
    merges the batch with other dims); {} when every cut is even."""
    size = traced_batch(graph)
    if size is None:
        return {}
    out: dict[str, Uneven] = {}
    for node_name, b in batch_dims(graph).items():
        lay = layouts[node_name]
        parts = lay.split_counts.get(b, 1) if b is not None else 1
        if parts == 1 or size % parts == 0:
            continue
        placements = tuple(Shard(0) if d == b else Replicate() for d in lay.axis_dims)
        local, offset = compute_local_shape_and_global_offset((size,), mesh, placements)
        out[node_name] = {b: (size, int(local[0]), int(offset[0]))}
        cuts = [c for group in (lay.input_strided, lay.param_strided, lay.output_strided) for cs in group for c in cs]
        if any(c.dim == b for c in cuts):
            raise LayoutError(f"node {node_name} cuts the batch as a minor dim of a merged axis, which a batch of "
                              f"{size} does not divide evenly over {parts} parts: use batches that "
                              f"{parts} divides (DataLoader(drop_last=True))")
    return out


def batch_axes(layouts: dict[str, NodeLayout], uneven: dict[str, Uneven]) -> set[int]:
    """The mesh axes that cut an uneven batch somewhere."""
    return {a for name, dims in uneven.items() for a, d in enumerate(layouts[name].axis_dims) if d in dims}


def check_move(name: str, shape: tuple[int, ...], size: int, axes: set[int], *layouts: Placements) -> None:
    """One-line LayoutError where a move would cut an axis that merges an uneven batch with other
    dims (a multiple of the batch, not the batch itself) on a mesh axis that cuts the batch."""
    for placements in layouts:
        for a, p in enumerate(placements):
            if a in axes and p.is_shard():
                k = p.dim % len(shape)
                if shape[k] != size and shape[k] % size == 0:
                    raise LayoutError(f"{name}: this plan moves a value whose axis {k} (size {shape[k]}) merges the "
                                      f"batch with another dim, cut over the mesh; a batch of {size} cannot be cut "
                                      "there evenly: use batches the data-parallel degree divides "
                                      "(DataLoader(drop_last=True))")


def whole_shape(node, env: dict, values: dict) -> tuple[int, ...] | None:
    """The whole (global) shape of the value program node ``node`` holds, from the traced values
    of the source node ``env`` maps to it; None for state the program reads as a placeholder."""
    from .values import concrete

    for src, v in env.items():
        if v.node is node and hasattr(values.get(src), "shape"):
            return tuple(int(s) for s in concrete(tuple(values[src].shape)))
    return None


@dataclasses.dataclass
class UnevenBatch:
    """What the program's builder needs of an uneven batch: its size, and the mesh axes cutting it."""

    size: int
    axes: set[int]

    def spec(self, spec: ReshardSpec, node, env: dict, values: dict) -> ReshardSpec:
        """``spec`` with the whole shape of the value moved (checked by ``check_move``); as it is
        for a parameter or buffer (no batch in it: its shards are even, as traced)."""
        shape = whole_shape(node, env, values)
        if shape is None:
            return spec
        check_move(getattr(node, "name", "a value"), shape, self.size, self.axes,
                   spec.src, spec.dst, spec.grad_in, spec.grad_out)
        return dataclasses.replace(spec, shape=shape)


def with_uneven_batch(graph: Graph, layouts: dict[str, NodeLayout], mesh: DeviceMesh) -> UnevenBatch | None:
    """``layouts`` given each node's uneven rows (in place); None where the batch divides evenly."""
    uneven = uneven_batch(graph, layouts, mesh)
    if not uneven:
        return None
    for name, dims in uneven.items():
        layouts[name] = dataclasses.replace(layouts[name], uneven=dims)
    return UnevenBatch(traced_batch(graph), batch_axes(layouts, uneven))
