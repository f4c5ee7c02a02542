"""One layout change of a local shard: the c10d collective itself where one mesh axis changes.

``DTensor.redistribute`` is the reference for every move, but on a CPU process group its
Python path (wrapping the local tensor, planning the transform, unwrapping) costs 0.3-0.8 ms per
call, more than the collective moves for the activations of a small model: 20 reshards a step
made autopar's tensor-parallel MLP 1.2x slower than ``parallelize_module``'s. The
common moves, where exactly one mesh axis changes and the shards are even, are the c10d calls
DTensor would make: a local slice (replicate -> shard), an all-reduce (partial -> replicate), a
reduce-scatter (partial -> shard), an all-gather (shard -> replicate), and for shard -> shard the
all-gather and local slice DTensor runs on a CPU group (gloo has no all-to-all), on that axis's
group. A move on several axes at once runs as those moves one axis at a time, in the order the
cost model prices it (``cost_models.comm.reshard_steps``: slices, a reduce-scatter, the
all-reduce, a gather), where a sum over several axes is one all-reduce over their flattened group
(as DTensor merges it); a move that order does not fit (nested shards, a cut moving between
axes, several reduce-scatters or gathers, shard -> shard) goes through DTensor whole, and a step
the one-axis path declines (uneven shards) through DTensor from where the walk stopped. Everything else
(uneven shards, non-sum partials, replicate -> partial) goes through DTensor unchanged.
``tests/codegen/test_moves.py`` checks every move against DTensor's on a 2x2 mesh.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Shard

Placements = tuple[Placement, ...]


def move(x: torch.Tensor, mesh: DeviceMesh, src: Placements, dst: Placements,
         shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """``x`` (this rank's shard under ``src``) as this rank's shard under ``dst``; ``shape``: the
    whole tensor's, given where the shards may be uneven (a batch its data-parallel degree does
    not divide): DTensor then moves it as shards of that shape (torch.chunk's sizes)."""
    if src == dst:
        return x
    if shape is not None:
        x = x.contiguous()  # DTensor's moves want a dense local shard
        stride = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(x, mesh, src, run_check=False, shape=torch.Size(shape),
                                  stride=stride).redistribute(mesh, dst).to_local()
    changed = [a for a, (s, d) in enumerate(zip(src, dst)) if s != d]
    if len(changed) == 1:
        out = _one_axis(x, mesh, changed[0], src[changed[0]], dst[changed[0]], src)
        if out is not None:
            return out
    else:
        x, src = _walk(x, mesh, src, dst, changed)
        if src == dst:
            return x
    return DTensor.from_local(x.contiguous(), mesh, src, run_check=False).redistribute(mesh, dst).to_local()


def _walk(x: torch.Tensor, mesh: DeviceMesh, src: Placements, dst: Placements,
          changed: list[int]) -> tuple[torch.Tensor, Placements]:
    """A move on several axes as single-axis moves, in the cost model's order: replicate ->
    shard slices (lowest axis first: the major cut), one partial -> shard reduce-scatter, the
    partial -> replicate sums as one all-reduce over their axes' flattened group, one shard ->
    replicate gather. Returns where it got to (DTensor does the rest, if anything is left)."""
    def kind(a: int) -> str:
        s, d = src[a], dst[a]
        if s.is_replicate() and d.is_shard():
            return "slice"
        if is_sum(s):
            return "rs" if d.is_shard() else "ar" if d.is_replicate() else "other"
        return "ag" if s.is_shard() and d.is_replicate() else "other"

    by: dict[str, list[int]] = {"slice": [], "rs": [], "ar": [], "ag": [], "other": []}
    for a in changed:
        by[kind(a)].append(a)
    if by["other"] or len(by["rs"]) > 1 or len(by["ag"]) > 1 or (len(by["ar"]) > 1 and mesh.mesh_dim_names is None) \
            or not _same_cuts(src, dst, x.dim()):
        return x, src  # not a walk the cost model prices step by step: DTensor's, whole
    steps = [[a] for a in by["slice"] + by["rs"]] + ([by["ar"]] if by["ar"] else []) + [[a] for a in by["ag"]]
    cur = list(src)
    for axes in steps:
        if len(axes) == 1:
            y = _one_axis(x, mesh, axes[0], cur[axes[0]], dst[axes[0]], tuple(cur))
            if y is None:
                return x, tuple(cur)
        else:  # a sum over several axes: one all-reduce over their group (as DTensor merges it)
            y = _copy(x)  # the input may be saved for a backward: never reduce in place
            dist.all_reduce(y, group=axes_group(mesh, tuple(axes)))
        x = y
        for a in axes:
            cur[a] = dst[a]
    return x, tuple(cur)


def _same_cuts(src: Placements, dst: Placements, ndim: int) -> bool:
    """Each tensor dim cut by at most one mesh axis, the same one in ``src`` and ``dst`` where both
    cut it: no nested shards, no cut moving between axes (DTensor's order differs there, and the
    cost model prices DTensor's)."""
    cut: dict[int, int] = {}
    for layout in (src, dst):
        seen = set()
        for a, p in enumerate(layout):
            if p.is_shard():
                k = p.dim % ndim
                if type(p) is not Shard or k in seen or cut.setdefault(k, a) != a:
                    return False
                seen.add(k)
    return True


def axes_group(mesh: DeviceMesh, axes: tuple[int, ...]) -> dist.ProcessGroup:
    """The process group of the mesh axes ``axes`` (a flattened sub-mesh for several, which
    DeviceMesh creates once, collectively, and caches)."""
    if len(axes) == 1:
        return mesh.get_group(axes[0])
    names = mesh.mesh_dim_names
    if names is None:
        raise ValueError("a collective over several mesh axes needs a mesh with dim names")
    return mesh[tuple(names[a] for a in axes)]._flatten().get_group()


def is_sum(p: Placement) -> bool:
    """A partial sum (not a partial max, min or average)."""
    return p.is_partial() and getattr(p, "reduce_op", "sum") == "sum"


def _one_axis(x: torch.Tensor, mesh: DeviceMesh, axis: int, s: Placement, d: Placement,
              src: Placements) -> torch.Tensor | None:
    """The move on mesh axis ``axis`` alone, or None where DTensor should do it."""
    if _nested(s, axis, src, x.dim()) or _nested(d, axis, src, x.dim()):
        return None
    n, rank = mesh.size(axis), mesh.get_local_rank(axis)
    group = mesh.get_group(axis)
    if d.is_shard() and x.shape[d.dim % x.dim()] % n:
        return None  # uneven shards: DTensor pads them
    if s.is_replicate() and d.is_shard():
        return _block(x, d.dim % x.dim(), n, rank)
    if is_sum(s) and d.is_replicate():
        y = _copy(x)  # the input may be saved for a backward: never reduce in place
        dist.all_reduce(y, group=group)
        return y
    if is_sum(s) and d.is_shard():
        k = d.dim % x.dim()
        c = x.shape[k] // n
        # the n blocks of dim k stacked first: one copy in, and the result comes out in place
        if k == 0:
            whole, out = x.contiguous(), x.new_empty((c, *x.shape[1:]))
        else:
            stacked = x.unflatten(k, (n, c)).movedim(k, 0).contiguous()
            whole, out = stacked.flatten(0, 1), x.new_empty(stacked.shape[1:])
        dist.reduce_scatter_single(out, whole, group=group)
        return out
    if s.is_shard() and d.is_replicate():
        return _all_gather(x, s.dim % x.dim(), n, group)
    if s.is_shard() and d.is_shard():  # as DTensor runs it on a CPU group: gather, keep this rank's block
        return _block(_all_gather(x, s.dim % x.dim(), n, group), d.dim % x.dim(), n, rank)
    return None


def _nested(p: Placement, axis: int, src: Placements, ndim: int) -> bool:
    """A cut a local collective on ``axis`` cannot make: a strided shard, or a tensor dim also cut
    by a later mesh axis (nested inside this axis's cut)."""
    if not p.is_shard():
        return False
    return type(p) is not Shard or any(
        type(q) is not Shard or (b > axis and q.dim % ndim == p.dim % ndim)
        for b, q in enumerate(src) if b != axis and q.is_shard())


def _copy(x: torch.Tensor) -> torch.Tensor:
    """``x`` copied once into a new contiguous buffer, whatever its strides: the one copy the cost
    model prices a reshard step (``alpha_beta.reshard_local``). ``x.contiguous().clone()`` copies a
    strided ``x`` twice; a gradient of a permuted view arrives strided (the gpt's heads)."""
    return x.clone(memory_format=torch.contiguous_format)


def _block(x: torch.Tensor, k: int, n: int, rank: int) -> torch.Tensor:
    """This rank's block of dim ``k`` cut in ``n`` (even) blocks, contiguous."""
    c = x.shape[k] // n
    return x.narrow(k, rank * c, c).contiguous()


def _all_gather(x: torch.Tensor, k: int, n: int, group) -> torch.Tensor:
    """The ranks' blocks of dim ``k`` side by side: one collective, at most one copy."""
    part = x.contiguous()
    out = part.new_empty((n * part.shape[0], *part.shape[1:]))
    dist.all_gather_single(out, part, group=group)
    if k == 0:
        return out
    # the ranks' blocks are stacked first: one copy puts them side by side on dim k. flatten
    # alone is a view, not that copy, where the block's dim k is 1 long: contiguous, as DTensor's
    # gather is (a ``view`` reading the result failed on the strided one)
    return out.unflatten(0, (n, part.shape[0])).movedim(0, k).flatten(k, k + 1).contiguous()


__all__ = ["axes_group", "move"]
