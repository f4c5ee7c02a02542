"""ZeRO-1/2/3 on the gradient buckets: each data-parallel rank steps only its slice of the optimizer.

The plan's ZeRO axes (``Strategy.zero_axes``: the mesh axes that split the batch) are where a
parameter's local shard is replicated and its gradient a partial sum. ``GradReducer`` already
packs those gradients into flat buckets; under ZeRO each bucket is cut into equal slices over the
group of its ZeRO axes (padded with zeros to a multiple of the group's size), and this rank keeps
one slice of the bucket's parameters as a flat full-precision master tensor: the only tensor its
optimizer steps, so its optimizer state is 1/g of the bucket's. Stage 1 all-reduces the bucket as
before and reads this rank's slice of the sum; stage 2 reduce-scatters it (``reduce_scatter_single``)
and keeps only the slice (the parameters' own ``.grad`` stay None). After the step every rank
all-gathers the updated slices (``all_gather_single``) into its parameters' local tensors.

Why buckets rather than ``torch.distributed.optim.ZeroRedundancyOptimizer``: that one assigns whole
parameters to ranks (state per rank only near 1/g), all-reduces the full gradients (no stage 2)
and needs one process group, while gradients here reduce over different groups of mesh axes per
bucket; the buckets already hold flat gradients in the order the backward produces them, so the
reduce-scatter is one collective per bucket where the all-reduce was.

ZeRO-3 (parameters stored sharded between uses): each sliced bucket's parameters become views
into one flat, padded tensor (``ZeroBucket.flat``, FSDP1's flat parameter) whose storage is
resized to 0 between uses, so a rank holds only its master slice. A bucket holds one unit's
parameters (a block, or the root), gathered (``gather``, a prefetch left under way) and freed
(``release``) per unit around the unit's forward and its backward by ``zero_units.py``, as
``fully_shard`` on each block does: two all-gathers of a block per step, as the cost model
prices them. ``fully_shard`` itself does not fit: it hooks a module's forward, which the
generated program does not call (it reads the parameters' local tensors itself).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class ZeroBucket:
    """One bucket's slicing: this rank's slice ``[rank*size, (rank+1)*size)`` of the padded flat bucket."""

    group: dist.ProcessGroup  # the bucket's ZeRO axes
    rest: dist.ProcessGroup | None  # the other axes its gradients sum over (all-reduced on the slice)
    parts: int
    rank: int
    numel: int  # the bucket's padded length: parts * slice
    master: torch.Tensor  # this rank's slice of the bucket's parameters, what the optimizer steps
    incoming: torch.Tensor | None = None  # stage 2: the reduce-scatter's output, until the backward ends
    flat: torch.Tensor | None = None  # stage 3: the whole bucket, the parameters its views (storage freed between uses)
    pending: object = None  # stage 3: the all-gather of a prefetch under way (its work handle)

    @property
    def slice(self) -> int:
        return self.numel // self.parts


def zero_buckets(mesh, buckets: list[list[torch.Tensor]], bucket_axes: list[tuple[int, ...]],
                 zero_axes: tuple[int, ...] | None, group_of) -> dict[int, ZeroBucket]:
    """The ZeRO slicing of each bucket whose gradients sum over some ZeRO axis."""
    out = {}
    for b, (leaves, axes) in enumerate(zip(buckets, bucket_axes)):
        zaxes = tuple(a for a in axes if zero_axes is None or a in zero_axes)
        if not zaxes:
            continue
        parts = math.prod(mesh.shape[a] for a in zaxes)
        rest = tuple(a for a in axes if a not in zaxes)
        group = group_of(zaxes)
        rank = dist.get_rank(group)
        total = sum(leaf.numel() for leaf in leaves)
        numel = -(-total // parts) * parts
        with torch.no_grad():
            flat = torch.zeros(numel, dtype=leaves[0].dtype, device=leaves[0].device)
            flat[:total] = torch.cat([leaf.detach().reshape(-1) for leaf in leaves])
            master = flat[rank * (numel // parts):(rank + 1) * (numel // parts)].clone()
        out[b] = ZeroBucket(group, group_of(rest) if rest else None, parts, rank, numel, master)
    return out


def store_sharded(z: ZeroBucket, leaves: list[torch.Tensor]) -> None:
    """ZeRO-3: the bucket's parameters as views of one padded flat tensor (``leaf.data`` swapped:
    the same autograd leaves and DTensor locals), then freed."""
    with torch.no_grad():
        flat = torch.zeros(z.numel, dtype=leaves[0].dtype, device=leaves[0].device)
        offset = 0
        for leaf in leaves:
            view = flat[offset:offset + leaf.numel()].view_as(leaf)
            view.copy_(leaf)
            leaf.data = view
            offset += leaf.numel()
    z.flat = flat
    release(z)


def gathered(z: ZeroBucket) -> bool:
    return z.flat is None or z.flat.untyped_storage().nbytes() > 0


def gather(z: ZeroBucket, wait: bool = True) -> None:
    """ZeRO-3: the bucket's whole parameters back from every rank's master slice (if freed);
    ``wait=False``: started (a prefetch), waited for by the next ``gather`` or ``release``."""
    if gathered(z):
        if wait:
            settle(z)
        return
    with torch.no_grad():
        z.flat.untyped_storage().resize_(z.numel * z.flat.element_size())
        # into a fresh tensor on the storage: the parameters (views of it) keep their versions,
        # so the backward still reads what the forward saved of them
        out = torch.empty(0, dtype=z.flat.dtype, device=z.flat.device).set_(z.flat.untyped_storage(), 0, (z.numel,))
        z.pending = dist.all_gather_single(out, z.master.detach(), group=z.group, async_op=True)
    if wait:
        settle(z)


def settle(z: ZeroBucket) -> None:
    """Wait for the bucket's prefetch, if one is under way."""
    if z.pending is not None:
        z.pending.wait()
        z.pending = None


def release(z: ZeroBucket) -> None:
    """ZeRO-3: free the bucket's whole parameters (the master slice keeps this rank's part)."""
    if z.flat is not None:
        settle(z)
        z.flat.untyped_storage().resize_(0)


def refresh_master(z: ZeroBucket, leaves: list[torch.Tensor]) -> None:
    """The master slice from the (whole) parameters: after a checkpoint loaded into them."""
    with torch.no_grad():
        flat = z.flat if z.flat is not None else torch.cat([leaf.detach().reshape(-1) for leaf in leaves])
        start = z.rank * z.slice
        part = flat[start:min(start + z.slice, flat.numel())]
        z.master.zero_()
        z.master[:part.numel()].copy_(part)


class ShardedOptimizer:
    """``cls`` over this rank's ZeRO slices (and the parameters no ZeRO axis reduces); ``step``
    then gathers the updated parameters. One parameter group: ``kwargs`` apply to every parameter."""

    def __init__(self, reducer, cls, **kwargs):
        self.reducer = reducer
        sliced = {id(leaf) for b in reducer.shards for leaf in reducer.buckets[b]}
        plain = [leaf for _, leaf in reducer.leaves if id(leaf) not in sliced]  # no ZeRO axis: whole
        self.optimizer = cls([z.master for z in reducer.shards.values()] + plain, **kwargs)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def state_numel(self) -> int:
        """Elements of optimizer state this rank holds (the test that it is 1/g of the parameters')."""
        return sum(v.numel() for s in self.optimizer.state.values() for v in s.values()
                   if isinstance(v, torch.Tensor) and v.dim() > 0)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)
        for p, leaf in self.reducer.leaves:
            p.grad = None
            leaf.grad = None

    @torch.no_grad()
    def step(self, closure=None):
        loss = self.optimizer.step(closure)
        for b, z in self.reducer.shards.items():
            if z.flat is not None:  # ZeRO-3: the next forward gathers the updated slices
                release(z)
                continue
            full = torch.empty(z.numel, dtype=z.master.dtype, device=z.master.device)
            dist.all_gather_single(full, z.master, group=z.group)
            offset = 0
            for leaf in self.reducer.buckets[b]:
                leaf.copy_(full[offset:offset + leaf.numel()].view_as(leaf))
                offset += leaf.numel()
        return loss

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)
