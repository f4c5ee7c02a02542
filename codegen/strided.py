"""Minor-dim (strided) cuts of merged axes, done locally around a node's computation.

A view ``(b, s, h*d) -> (b, s, h, d)`` whose config cuts ``d`` needs, on each device, ``h``
separate blocks of the input's last axis. DTensor has no public placement for that, so the input
arrives ``Replicate`` on the cutting mesh axis and :func:`take_blocks` keeps this device's blocks;
a merged *output* axis cut on a minor dim leaves the device's blocks in place with zeros around
them (:func:`place_blocks`), labelled ``Partial``: the sum over the mesh axis is the whole tensor.
Both are differentiable (narrow and cat), so the gradients follow by autograd.
"""

from __future__ import annotations

import torch

from autopar.core.ir import Node, TensorSpec

from .placements import StridedCut


def chunk_index(dim: str, axis_dims, mesh_shape, coord) -> int:
    """This device's chunk of ``dim``: its coordinates on the mesh axes cutting it, first major."""
    index = 0
    for a, d in enumerate(axis_dims):
        if d == dim:
            index = index * mesh_shape[a] + coord[a]
    return index


def take_blocks(t: torch.Tensor, spec: TensorSpec, cuts: tuple[StridedCut, ...], node: Node,
                counts: dict[str, int], index) -> torch.Tensor:
    """From the DTensor-local tensor (major cuts applied), keep this device's minor-dim blocks."""
    cut = {axis: {spec.axes[axis][0]} for axis, _ in _groups(cuts)}  # DTensor cut the majors
    for axis, dim in _groups(cuts):
        sizes = _sizes(spec.axes[axis], node, counts, cut[axis])
        pos = spec.axes[axis].index(dim)
        chunk = sizes[pos] // counts[dim]
        x = _expand(t, axis, sizes).narrow(axis + pos, index(dim) * chunk, chunk)
        t = x.reshape(*t.shape[:axis], -1, *t.shape[axis + 1:])
        cut[axis].add(dim)
    return t


def local_extent(t: torch.Tensor, spec: TensorSpec, node: Node, counts: dict[str, int],
                 index, uneven=()) -> torch.Tensor:
    """Cut an output axis the local call produced whole down to this device's part.

    An output dim that indexes no input axis (a partial slice's fresh dim, a factory's) comes out
    of the local call at full size on every device, while the layout says it is cut. An axis led
    by an ``uneven`` batch dim indexes an input: it comes out as this rank's rows already.
    """
    for axis, (size, dims) in enumerate(zip(spec.shape, spec.axes)):
        cut_dims = [d for d in dims if counts.get(d, 1) > 1]
        if not cut_dims or dims[0] in uneven or t.shape[axis] != size:
            continue
        cut: set[str] = set()
        for dim in cut_dims:
            sizes = _sizes(dims, node, counts, cut)
            pos = dims.index(dim)
            chunk = sizes[pos] // counts[dim]
            x = _expand(t, axis, sizes).narrow(axis + pos, index(dim) * chunk, chunk)
            t = x.reshape(*t.shape[:axis], -1, *t.shape[axis + 1:])
            cut.add(dim)
    return t


def place_blocks(t: torch.Tensor, spec: TensorSpec, cuts: tuple[StridedCut, ...], node: Node,
                 counts: dict[str, int], index) -> torch.Tensor:
    """Put the local result's minor-dim blocks where they belong, zeros around them."""
    cut = {axis: set(spec.axes[axis]) for axis, _ in _groups(cuts)}  # the local result: all cut
    for axis, dim in _groups(cuts):
        sizes = _sizes(spec.axes[axis], node, counts, cut[axis])
        pos = spec.axes[axis].index(dim)
        x = _expand(t, axis, sizes)
        full = node.dim(dim).size
        before = index(dim) * sizes[pos]
        parts = [x.new_zeros(_with(x.shape, axis + pos, before)), x,
                 x.new_zeros(_with(x.shape, axis + pos, full - before - sizes[pos]))]
        x = torch.cat(parts, dim=axis + pos)
        t = x.reshape(*t.shape[:axis], -1, *t.shape[axis + 1:])
        cut[axis].discard(dim)
    return t


def _groups(cuts: tuple[StridedCut, ...]) -> list[tuple[int, str]]:
    seen: list[tuple[int, str]] = []
    for c in cuts:
        if (c.axis, c.dim) not in seen:
            seen.append((c.axis, c.dim))
    return seen


def _sizes(dims, node: Node, counts: dict[str, int], cut: set[str]) -> list[int]:
    """Current sizes of a merged axis's dims: divided where already ``cut``, whole otherwise."""
    return [node.dim(d).size // (counts.get(d, 1) if d in cut else 1) for d in dims]


def _expand(t: torch.Tensor, axis: int, sizes: list[int]) -> torch.Tensor:
    return t.reshape(*t.shape[:axis], *sizes, *t.shape[axis + 1:])


def _with(shape, i: int, n: int) -> tuple[int, ...]:
    s = list(shape)
    s[i] = n
    return tuple(s)
