"""DTensor placements of every tensor a node touches, derived from the IR and the node's config.

The design notes (why it is built this way, what was checked) are in docs/codegen.md, "Placements from the IR".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.distributed.tensor import Partial, Placement, Replicate, Shard

from autopar.core.ir import Node, TensorSpec, carried_dim
from autopar.core.tables import Config

Placements = tuple[Placement, ...]
WHOLE_DIMS = {"lstm": frozenset({"h", "dir"})}  # op -> dims whose cut runs the node whole
ADDITIVE_OPS = frozenset({"linear", "matmul", "einsum", "conv1d", "conv2d", "conv3d"})


@dataclass(frozen=True)
class StridedCut:
    """Mesh axis ``mesh_axis`` cuts ``dim``, a minor dim of merged tensor axis ``axis``."""

    mesh_axis: int
    axis: int
    dim: str


class LayoutError(ValueError):
    """A config asks for a layout DTensor cannot hold as a plain shard (e.g. a minor-dim split)."""


@dataclass(frozen=True)
class NodeLayout:
    """The placements one node needs: per data input, per parameter, per output; and grads."""

    inputs: tuple[Placements, ...]
    params: tuple[Placements, ...]
    outputs: tuple[Placements, ...]
    input_grads: tuple[Placements, ...]
    param_grads: tuple[Placements, ...]
    split_counts: dict[str, int]  # dim name -> number of parts (1 = unsplit)
    axis_dims: tuple[str | None, ...]  # per mesh axis, the dim it cuts (None: it replicates)
    input_additive: tuple[tuple[int, ...], ...] = ()  # per input: mesh axes where it is added
    param_additive: tuple[tuple[int, ...], ...] = ()  # once, by coordinate 0 (see above)
    input_strided: tuple[tuple[StridedCut, ...], ...] = ()  # per input: minor-dim cuts
    param_strided: tuple[tuple[StridedCut, ...], ...] = ()
    output_strided: tuple[tuple[StridedCut, ...], ...] = ()
    # a batch dim cut unevenly on this rank (a batch its data-parallel degree does not divide):
    # dim name -> (whole size, this rank's size, this rank's offset), ``uneven.py``
    uneven: dict[str, tuple[int, int, int]] = field(default_factory=dict)


def mesh_axis_dims(node: Node, config: Config | None, mesh_ndim: int) -> list[str | None]:
    """For each mesh axis, the name of the node dim it cuts (None: the axis replicates)."""
    owner: list[str | None] = [None] * mesh_ndim
    if config is None or not config.mesh_axes:
        if config is not None and any(s > 1 for s in config.splits):
            raise LayoutError(f"node {node.name}: config {config} has splits but no mesh axes")
        return owner
    if len(config.mesh_axes) != len(node.dims):
        raise LayoutError(f"node {node.name}: config has {len(config.mesh_axes)} dims, "
                          f"node has {len(node.dims)}")
    for dim, axes in zip(node.dims, config.mesh_axes):
        if list(axes) != sorted(axes):
            raise LayoutError(f"node {node.name}: mesh axes {axes} of dim {dim.name!r} are not "
                              "ascending; DTensor shards by mesh dims in ascending order")
        for a in axes:
            if not 0 <= a < mesh_ndim:
                raise LayoutError(f"node {node.name}: mesh axis {a} outside a {mesh_ndim}-d mesh")
            if owner[a] is not None:
                raise LayoutError(f"node {node.name}: mesh axis {a} cuts both "
                                  f"{owner[a]!r} and {dim.name!r}")
            owner[a] = dim.name
    return owner


def tensor_placements(spec: TensorSpec, owner: list[str | None], node: Node,
                      output: bool = False) -> Placements:
    """Forward placements of one tensor of ``node``; ``owner`` from :func:`mesh_axis_dims`.

    A minor-dim (strided) cut is ``Replicate`` here for an input, ``Partial`` for an output; see
    :func:`strided_cuts` for the blocks.
    """
    out: list[Placement] = []
    for a, dim in enumerate(owner):
        if dim is None:
            out.append(Replicate())
            continue
        axis, major = _axis_of(spec, dim)
        if axis is None and carried_dim(node, dim) is not None:  # expert parallelism: tokens stay cut
            axis, major = _axis_of(spec, carried_dim(node, dim))
        if axis is not None and major:
            out.append(Shard(axis))
        elif output and (axis is not None or node.dim(dim).reduction):
            out.append(Partial())
        else:
            out.append(Replicate())
    return tuple(out)


def strided_cuts(spec: TensorSpec, owner: list[str | None]) -> tuple[StridedCut, ...]:
    """The mesh axes that cut a minor dim of one of the tensor's merged axes."""
    cuts = []
    for a, dim in enumerate(owner):
        if dim is not None:
            axis, major = _axis_of(spec, dim)
            if axis is not None and not major:
                cuts.append(StridedCut(a, axis, dim))
    return tuple(cuts)


def grad_placements(forward: Placements, owner: list[str | None]) -> Placements:
    """Placements of an input's gradient: replicated reads of a split node sum their gradients."""
    return tuple(Partial() if p.is_replicate() and dim is not None else p
                 for p, dim in zip(forward, owner))


def additive_axes(forward: Placements, node: Node, owner: list[str | None]) -> tuple[int, ...]:
    """Mesh axes where an operand of a contraction is replicated while the axis cuts a reduction
    dim that the outputs lack (so they are partial sums there)."""
    if node.op not in ADDITIVE_OPS:
        return ()
    out_dims = {d for spec in node.outputs for axis in spec.axes for d in axis}
    return tuple(a for a, (p, dim) in enumerate(zip(forward, owner))
                 if p.is_replicate() and dim is not None and node.dim(dim).reduction
                 and dim not in out_dims)


def node_layout(node: Node, config: Config | None, mesh_shape: tuple[int, ...]) -> NodeLayout:
    owner = mesh_axis_dims(node, config, len(mesh_shape))
    outs = tuple(tensor_placements(spec, owner, node, output=True) for spec in node.outputs)
    whole = WHOLE_DIMS.get(node.op, frozenset())
    read = [None if d in whole else d for d in owner]  # how the operands are read
    ins = tuple(tensor_placements(op.spec, read, node) for op in node.inputs)
    params = tuple(tensor_placements(op.spec, read, node) for op in node.params)
    counts = {d.name: 1 for d in node.dims}
    for a, dim in enumerate(owner):
        if dim is not None:
            counts[dim] *= mesh_shape[a]
    return NodeLayout(ins, params, outs,
                      tuple(grad_placements(p, owner) for p in ins),
                      tuple(grad_placements(p, owner) for p in params), counts, tuple(owner),
                      tuple(additive_axes(p, node, owner) for p in ins),
                      tuple(additive_axes(p, node, owner) for p in params),
                      tuple(strided_cuts(op.spec, read) for op in node.inputs),
                      tuple(strided_cuts(op.spec, read) for op in node.params),
                      tuple(strided_cuts(spec, owner) for spec in node.outputs))


def local_shape(spec: TensorSpec, counts: dict[str, int],
                uneven: dict[str, tuple[int, int, int]] | None = None) -> tuple[int, ...]:
    """The shape the node's local computation sees: every dim of every axis cut (strided too);
    an axis led by an ``uneven`` dim holds this rank's rows of it (``NodeLayout.uneven``)."""
    shape = []
    for size, dims in zip(spec.shape, spec.axes):
        parts = 1
        for d in dims:
            parts *= counts.get(d, 1)
        if uneven and dims and dims[0] in uneven:
            whole, mine, _ = uneven[dims[0]]
            parts //= counts.get(dims[0], 1)
            shape.append(size // whole * mine // parts)
            continue
        if size % parts:
            raise LayoutError(f"axis of size {size} does not split into {parts} even parts")
        shape.append(size // parts)
    return tuple(shape)


def _axis_of(spec: TensorSpec, dim: str) -> tuple[int | None, bool]:
    """(the tensor axis ``dim`` indexes, whether it is that axis's major dim); (None, False)."""
    for i, dims in enumerate(spec.axes):
        if dim in dims:
            return i, dims[0] == dim
    return None, False
