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
    # stage 3 under mixed precision: the whole bucket in the compute dtype, the leaves the program
    # reads its views (FSDP2's unsharded parameters under ``MixedPrecisionPolicy(param_dtype)``)
    compute: torch.Tensor | None = None
    source: torch.Tensor | None = None  # the cast master slice an all-gather under way reads

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


def store_compute(z: ZeroBucket, leaves: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """ZeRO-3 under mixed precision: new autograd leaves in ``dtype``, views of one padded flat
    tensor (``z.compute``, freed between uses), for the program to read in place of ``leaves``.
    Gathered from the master slices cast to ``dtype``, as ``fully_shard`` with
    ``MixedPrecisionPolicy(param_dtype=dtype)`` gathers: a block held whole costs its parameters
    and gradients in ``dtype`` (what ``cost_models.training.param_bytes`` prices), not in fp32, and
    its gradients are reduce-scattered in ``dtype`` (FSDP2's default ``reduce_dtype``), added to the
    fp32 master slice's. ``leaves`` (the fp32 views of ``z.flat``) stay for state dicts."""
    flat = torch.zeros(z.numel, dtype=dtype, device=z.master.device)
    out, offset = [], 0
    for leaf in leaves:
        low = torch.empty(0, dtype=dtype, device=flat.device)
        low.data = flat[offset:offset + leaf.numel()].view_as(leaf)
        out.append(low.requires_grad_(True))
        offset += leaf.numel()
    z.compute = flat
    release(z)
    return out


def _whole(z: ZeroBucket, full: bool) -> torch.Tensor | None:
    """The tensor a gather fills: the compute copy where there is one (``full``: the fp32 one)."""
    return z.flat if full or z.compute is None else z.compute


def gathered(z: ZeroBucket, full: bool = False) -> bool:
    t = _whole(z, full)
    return t is None or t.untyped_storage().nbytes() > 0


def gather(z: ZeroBucket, wait: bool = True, full: bool = False) -> None:
    """ZeRO-3: the bucket's whole parameters back from every rank's master slice (if freed), in
    the compute dtype under mixed precision (``full``: the fp32 ones, for a state dict);
    ``wait=False``: started (a prefetch), waited for by the next ``gather`` or ``release``."""
    if gathered(z, full):
        if wait:
            settle(z)
        return
    settle(z)  # one all-gather of a bucket under way at a time
    t = _whole(z, full)
    with torch.no_grad():
        t.untyped_storage().resize_(z.numel * t.element_size())
        # into a fresh tensor on the storage: the parameters (views of it) keep their versions,
        # so the backward still reads what the forward saved of them
        out = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), 0, (z.numel,))
        z.source = z.master.detach().to(t.dtype)  # cast before the all-gather: it moves t's bytes
        z.pending = dist.all_gather_single(out, z.source, group=z.group, async_op=True)
    if wait:
        settle(z)


def settle(z: ZeroBucket) -> None:
    """Wait for the bucket's prefetch, if one is under way."""
    if z.pending is not None:
        z.pending.wait()
        z.pending = None
        z.source = None


def release(z: ZeroBucket) -> None:
    """ZeRO-3: free the bucket's whole parameters (the master slice keeps this rank's part)."""
    settle(z)
    for t in (z.flat, z.compute):
        if t is not None:
            t.untyped_storage().resize_(0)


def refresh_master(z: ZeroBucket, leaves: list[torch.Tensor]) -> None:
    """The master slice from the (whole) parameters: after a checkpoint loaded into them."""
    with torch.no_grad():
        flat = z.flat if z.flat is not None else torch.cat([leaf.detach().reshape(-1) for leaf in leaves])
        start = z.rank * z.slice
        part = flat[start:min(start + z.slice, flat.numel())]
        z.master.zero_()
        z.master[:part.numel()].copy_(part)
    if z.compute is not None:  # a compute copy gathered before the load: gathered again from the master
        settle(z)
        z.compute.untyped_storage().resize_(0)


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
