"""Where each piece of a tensor lives on the device mesh under a node's config.

A *layout* gives one placement per mesh axis, as ``torch.distributed.tensor`` does:

* ``Shard(axis)``: the devices along this mesh axis hold consecutive slices of tensor ``axis``;
  ``period > 1`` marks a strided shard: the tensor axis merges several dims (``("h", "d")``) and
  the split dim is not the major one, so each device holds ``period`` separate blocks;
* ``Replicate()``: every device along the mesh axis holds the same values;
* ``Partial()``: every device holds a summand; the tensor is the sum over the mesh axis.

The derivation is the iteration-space rule of ``autopar.core.ir``: mesh axis ``a`` cuts dim ``d``
(``a in config.mesh_axes[i]``); a tensor axis indexed by ``d`` is sharded along ``a``; an output
not indexed by a *reduction* dim ``d`` is partial along ``a``; anything else is replicated.

Cost models and codegen both read this module, so a cost is always the cost of the layout codegen
builds. No torch import: it is plain data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import numpy as np

from autopar.core.ir import Node, TensorSpec, carried_dim
from autopar.core.tables import Config, Mesh


@dataclass(frozen=True)
class Shard:
    axis: int
    period: int = 1

    def __str__(self) -> str:
        return f"S({self.axis})" if self.period == 1 else f"S({self.axis}/{self.period})"


@dataclass(frozen=True)
class Replicate:
    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True)
class Partial:
    def __str__(self) -> str:
        return "P"


Placement = Union[Shard, Replicate, Partial]
Layout = tuple[Placement, ...]  # one placement per mesh axis

R = Replicate()
P = Partial()


def axis_owner(config: Config, n_mesh_axes: int) -> list[int | None]:
    """For each mesh axis, the index of the dim it cuts (None: the axis replicates the node)."""
    if config.splits and not config.mesh_axes and any(s > 1 for s in config.splits):
        raise ValueError("config has splits but no mesh_axes; map it onto the mesh first "
                         "(autopar.core.layout.to_mesh)")
    owner: list[int | None] = [None] * n_mesh_axes
    for i, axes in enumerate(config.mesh_axes):
        for a in axes:
            owner[a] = i
    return owner


def dim_placements(node: Node, spec: TensorSpec, output: bool = False) -> list[Placement]:
    """For each dim of ``node``: the placement a mesh axis cutting that dim gives ``spec``."""
    sizes = {d.name: d.size for d in node.dims}
    out: list[Placement] = []
    for dim in node.dims:
        place: Placement = P if (output and dim.reduction) else R
        for name in (dim.name, carried_dim(node, dim.name)):
            found = next(((t, names) for t, names in enumerate(spec.axes) if name and name in names), None)
            if found is not None:
                t, names = found
                k = names.index(name)
                place = Shard(t, math.prod(sizes.get(n, 1) for n in names[:k]))
                break
        out.append(place)
    return out


def tensor_layout(node: Node, config: Config, spec: TensorSpec, mesh: Mesh,
                  output: bool = False) -> Layout:
    """The layout of one tensor ``node`` reads or writes (``output=True`` for its results)."""
    return tensor_layouts(node, [config], spec, mesh, output)[0]


def tensor_layouts(node: Node, configs: list[Config], spec: TensorSpec, mesh: Mesh,
                   output: bool = False) -> list[Layout]:
    """``tensor_layout`` for many configs of one node (the per-dim work is done once)."""
    owners = [axis_owner(c, len(mesh.shape)) for c in configs]
    return _layouts_from_owners(node, owners, spec, output)


def _layouts_from_owners(node: Node, owners: list[list[int | None]], spec: TensorSpec,
                         output: bool = False) -> list[Layout]:
    dp = dim_placements(node, spec, output)
    return [tuple(R if i is None else dp[i] for i in own) for own in owners]


@dataclass(frozen=True)
class NodeLayouts:
    """Layouts of every operand of a node under one config, in the node's own order."""

    inputs: tuple[Layout, ...]
    params: tuple[Layout, ...]
    outputs: tuple[Layout, ...]


def node_layouts(node: Node, config: Config, mesh: Mesh) -> NodeLayouts:
    return node_layouts_many(node, [config], mesh)[0]


def node_layouts_many(node: Node, configs: list[Config], mesh: Mesh) -> list[NodeLayouts]:
    owners = [axis_owner(c, len(mesh.shape)) for c in configs]
    ins = [_layouts_from_owners(node, owners, op.spec) for op in node.inputs]
    ps = [_layouts_from_owners(node, owners, op.spec) for op in node.params]
    outs = [_layouts_from_owners(node, owners, s, output=True) for s in node.outputs]
    return [NodeLayouts(tuple(x[c] for x in ins), tuple(x[c] for x in ps), tuple(x[c] for x in outs))
            for c in range(len(configs))]


def grad_of_input(layout: Layout, node: Node, config: Config, mesh: Mesh) -> Layout:
    """Layout of the gradient the node's backward produces for an input (or parameter).

    Along a mesh axis that cuts a dim *not* indexing the tensor, every device used the whole
    tensor for a different piece of work, so each holds one summand of its gradient: Partial.
    Along an axis that replicates the whole node the gradients are equal copies: Replicate.
    """
    owner = axis_owner(config, len(mesh.shape))
    return tuple(P if (isinstance(pl, Replicate) and owner[a] is not None) else pl
                 for a, pl in enumerate(layout))


def grad_of_output(layout: Layout) -> Layout:
    """Layout the gradient of an output must arrive in: that of the output, Partial -> Replicate
    (the gradient of a sum with respect to each summand is the gradient of the sum)."""
    return tuple(R if isinstance(pl, Partial) else pl for pl in layout)


def shard_factor(layout: Layout, mesh: Mesh) -> int:
    """How many pieces the layout cuts a tensor into (its local size is nbytes / this)."""
    return math.prod(mesh.shape[a] for a, pl in enumerate(layout) if isinstance(pl, Shard))


def local_bytes(spec: TensorSpec, layout: Layout, mesh: Mesh) -> float:
    return spec.nbytes / shard_factor(layout, mesh)


def to_mesh(config: Config, mesh: Mesh) -> Config | None:
    """Give a mesh-less config mesh axes (intra-node axes first), or None if it does not fit."""
    if config.mesh_axes or all(s == 1 for s in config.splits):
        return config if config.mesh_axes else Config(config.splits, ((),) * len(config.splits))
    free = list(range(len(mesh.shape)))[::-1]  # inner (intra-node) axes first
    axes_of: list[tuple[int, ...]] = []
    for s in config.splits:
        mine: list[int] = []
        rest = s
        for a in list(free):
            if rest % mesh.shape[a] == 0 and rest > 1:
                mine.append(a)
                free.remove(a)
                rest //= mesh.shape[a]
        if rest != 1:
            return None
        axes_of.append(tuple(sorted(mine)))
    return Config(config.splits, tuple(axes_of))


def owner_matrix(configs: list[Config], mesh: Mesh) -> tuple[np.ndarray, np.ndarray]:
    """``own[c, a]``: the dim mesh axis ``a`` cuts under config ``c`` (-1: none), and which configs
    are realizable on the mesh at all (mesh-less configs are mapped with ``to_mesh``)."""
    own = np.full((len(configs), len(mesh.shape)), -1, dtype=np.int64)
    ok = np.ones(len(configs), dtype=bool)
    for i, c in enumerate(configs):
        m = to_mesh(c, mesh)
        if m is None:
            ok[i] = False
            continue
        for d, axes in enumerate(m.mesh_axes):
            for a in axes:
                own[i, a] = d
    return own, ok


def shard_mask(node: Node, spec: TensorSpec, own: np.ndarray, output: bool = False) -> np.ndarray:
    """``[c, a]``: is the tensor sharded along mesh axis ``a`` under config ``c``."""
    is_shard = [isinstance(p, Shard) for p in dim_placements(node, spec, output)] + [False]
    return np.asarray(is_shard, dtype=bool)[own]


def shard_factors(node: Node, spec: TensorSpec, own: np.ndarray, mesh: Mesh,
                  output: bool = False) -> np.ndarray:
    """``shard_factor`` of the tensor's layout under every config (rows of ``own``)."""
    sizes = np.asarray(mesh.shape, dtype=float)
    return np.prod(np.where(shard_mask(node, spec, own, output), sizes, 1.0), axis=1)


def format_layout(layout: Layout) -> str:
    return "(" + ", ".join(str(p) for p in layout) + ")"
