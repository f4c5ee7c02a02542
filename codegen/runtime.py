"""What the generated program calls besides the model's own ops: reshards and gradient buckets.

``Reshard`` moves a local shard from one layout to another (``moves.move``: the c10d call where
one mesh axis changes, else DTensor's redistribute; the walk the cost model prices), forward and
backward, as one autograd step on plain tensors: no DTensor flows through the program, so ops
between reshards dispatch as plain torch ops.

``GradReducer`` all-reduces the gradients of parameters read replicated by a split node (the
data-parallel gradient sync) the way DDP does it: parameters in buckets of about 25 MB in the
order the backward produces their gradients, each bucket's all-reduce started asynchronously as
soon as its last gradient is accumulated (overlapping the rest of the backward), all waited for
when the backward ends. DDP itself cannot be used: its parameters are DTensors, and different
parameters reduce over different groups of mesh axes (a tensor-parallel weight only over the
data axes, a replicated one over all of them). Sums, not averages: the program computes the
global loss, so each rank's gradient is a partial sum of the true one. Under ZeRO-1/2 the buckets
are sliced over the data-parallel axes, stages 2 and 3 reduce-scatter them, and stage 3 holds one
unit's parameters per bucket, freed when its reduce-scatter starts (``zero.py``, ``zero_units.py``);
under mixed precision stage 3's leaves are the compute dtype's (``zero.store_compute``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard
from torch.utils import _pytree as pytree

from autopar.core.buckets import BUCKET_BYTES, make_buckets

from .moves import axes_group as _group
from .moves import is_sum, move

Placements = tuple[Placement, ...]


def fmt(placements: Placements) -> str:
    return "(" + ", ".join("R" if p.is_replicate() else "P" if p.is_partial() else f"S({p.dim})"
                           for p in placements) + ")"


def grad_target(placements: Placements) -> Placements:
    """What a producer expects its output's gradient to be: its own layout, a partial sum
    replaced by a replica (the gradient of a sum is the same on every term)."""
    return tuple(Replicate() if p.is_partial() else p for p in placements)


class _Redistribute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, spec):
        ctx.spec = spec
        with torch.no_grad():
            return move(x, spec.mesh, spec.src, spec.dst, spec.shape)

    @staticmethod
    def backward(ctx, g):
        s = ctx.spec
        with torch.no_grad():
            # as it comes (a permuted view's gradient is strided): ``move`` copies it once, densely
            return move(g, s.mesh, s.grad_in, s.grad_out, s.shape), None


@dataclass(frozen=True, eq=False)
class ReshardSpec:
    mesh: DeviceMesh
    src: Placements  # the producer's layout
    dst: Placements  # the layout the reader wants
    grad_in: Placements  # how the reader's gradient comes back
    grad_out: Placements  # how the producer wants it
    shape: tuple[int, ...] | None = None  # the whole value's, where its shards may be uneven


class Reshard(nn.Module):
    """One layout change of one value, forward and backward (``module.code`` shows each)."""

    def __init__(self, spec: ReshardSpec):
        super().__init__()
        self.spec = spec

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Redistribute.apply(x, self.spec)

    def extra_repr(self) -> str:
        s = self.spec
        return f"{fmt(s.src)} -> {fmt(s.dst)}, grad {fmt(s.grad_in)} -> {fmt(s.grad_out)}"


class OutputReshard(Reshard):
    """A reshard of a value the program returns (``outputs="replicate"``: made whole).

    ``CompiledModule.train_step`` defers it (``deferred``): the program then returns this rank's
    own shard or partial term, and the step finishes only the loss, after its backward is
    started. For a partial loss that saves a blocking all-reduce in the forward (the backward
    starts from this rank's term: the gradient of a sum is the same for every term), and the
    other outputs, which ``train_step`` drops, are not gathered at all."""

    deferred: list | None = None  # while deferred: where (output leaf, returned tensor, spec) go

    def __init__(self, spec: ReshardSpec, leaf: int):
        super().__init__(spec)
        self.leaf = leaf  # which of the program's output leaves (fx order) this one makes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.deferred is None:
            return super().forward(x)
        self.deferred.append((self.leaf, x, self.spec))
        return x


def reshard_probe(mesh: DeviceMesh):
    """A function gathering this rank's Shard(0) block of a tensor on the 1-D ``mesh`` through
    ``Reshard`` (its autograd function and ``move``): what the profiled cost model times to
    price a reshard's path beyond its collective (``cost_models/reshard_fit.py``)."""
    n = len(mesh.shape)
    gather = Reshard(ReshardSpec(mesh, (Shard(0),) * n, (Replicate(),) * n, (Replicate(),) * n, (Shard(0),) * n))
    return gather


def needs_reshard(spec: ReshardSpec) -> bool:
    return spec.src != spec.dst or spec.grad_in != spec.grad_out


def slice_input(x: torch.Tensor, mesh: DeviceMesh, dst: Placements) -> torch.Tensor:
    """This rank's shard of a whole (replicated) input: a local slice, no communication."""
    return move(x, mesh, tuple(Replicate() for _ in dst), dst)


class GradReducer:
    """Bucketed, overlapped all-reduce of parameter gradients (see the module docstring).

    It works on each parameter's local shard as a plain leaf tensor (the DTensor parameter's own
    local tensor, made a leaf that requires grad), so autograd accumulates plain tensors and the
    hooks are cheap; when the backward ends, every DTensor parameter's ``.grad`` is set to a
    DTensor view of its (reduced) local gradient, so optimizers and state dicts see DTensors."""

    def __init__(self, mesh: DeviceMesh, leaves: list[tuple[nn.Parameter, torch.Tensor, tuple[int, ...]]],
                 bucket_bytes: int = BUCKET_BYTES, zero: int = 0, zero_axes: tuple[int, ...] | None = None,
                 units: list[str] | None = None, compute: torch.dtype | None = None):
        self.mesh = mesh
        self.leaves = [(p, leaf) for p, leaf, _ in leaves]
        ids = {id(leaf): leaf for _, leaf, _ in leaves}
        units = units if int(zero) == 3 else None  # ZeRO-3: a bucket per unit (``zero_units.py``)
        plan = make_buckets([(str(id(leaf)), axes, leaf.numel() * leaf.element_size())
                             for _, leaf, axes in leaves], bucket_bytes, units)
        self.buckets = [[ids[int(k)] for k in b.names] for b in plan]
        unit_of = dict(zip((id(leaf) for _, leaf, _ in leaves), units or ()))
        self.bucket_unit = [unit_of.get(id(b[0])) for b in self.buckets]
        self.gated = False  # ZeRO-3 per unit: a bucket's parameters are freed once its gradients are in
        self.kept: set[int] = set()  # ZeRO-3 buckets no backward frees (a pipeline stage's root: ``zero_units.py``)
        self.bucket_axes = [b.axes for b in plan]
        self.groups = {axes: _group(mesh, axes) for axes in set(self.bucket_axes)}
        self._ready: list[int] = [0] * len(self.buckets)
        self._work: list[tuple[object, int]] = []
        self._buffers: dict[int, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        self._queued = False
        self._base: dict[int, torch.Tensor] = {}  # id(leaf) -> gradient already reduced (accumulation)
        self._started = False
        self.defer = False  # gradient accumulation: backwards that add locally, reduced by a later one
        self._held = False  # ``_base`` taken for the accumulation window under way
        self.zero = int(zero)
        self.shards = {}
        self.compute_leaves: dict[int, torch.Tensor] = {}  # id(parameter's local) -> the leaf the program reads
        if self.zero:
            from .zero import store_compute, store_sharded, zero_buckets

            self.shards = zero_buckets(mesh, self.buckets, self.bucket_axes, zero_axes, lambda a: _group(mesh, a))
            if self.zero == 3:
                for b, z in self.shards.items():
                    store_sharded(z, self.buckets[b])
                    if compute is not None and compute != z.master.dtype:  # gathered in the compute dtype
                        low = store_compute(z, self.buckets[b], compute)
                        self.compute_leaves.update((id(a), c) for a, c in zip(self.buckets[b], low))
                        self.buckets[b] = low
                swap = self.compute_leaves
                self.leaves = [(p, swap.get(id(leaf), leaf)) for p, leaf in self.leaves]
        self.bucket_of = {id(leaf): i for i, ls in enumerate(self.buckets) for leaf in ls}
        self._hooks = [leaf.register_post_accumulate_grad_hook(self._on_grad) for _, leaf in self.leaves]

    def gather_params(self) -> None:
        """ZeRO-3: every sliced bucket's parameters whole (before a forward, a state dict)."""
        from .zero import gather

        for z in self.shards.values():
            gather(z, full=True)

    def release_params(self, keep: set[int] = frozenset()) -> None:
        """ZeRO-3: free the sliced buckets' whole parameters (each rank keeps its master slice),
        but those of the buckets ``keep``."""
        from .zero import release

        for b, z in self.shards.items():
            if b not in keep:
                release(z)

    def refresh_masters(self) -> None:
        """ZeRO: the master slices from the parameters (after a checkpoint was loaded into them)."""
        from .zero import refresh_master

        for b, z in self.shards.items():
            refresh_master(z, self.buckets[b])

    def sync_zeroed(self) -> None:
        """Before a forward: a parameter whose ``.grad`` the optimizer set to None has its leaf's
        gradient dropped too (they are one tensor otherwise); not inside an accumulation window,
        whose earlier backwards left their gradients on the leaves only."""
        if self._held:
            return
        for p, leaf in self.leaves:
            if p.grad is None and leaf.grad is not None:
                leaf.grad = None

    def watch(self, out) -> None:
        """Call on the forward's outputs: when their backward starts, gradients already held
        (accumulation over several backwards, microbatches of a pipeline) are set aside, so that
        only what this backward adds is summed over the ranks."""
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(self._begin)

    def reduce_added(self, run) -> None:
        """``run()`` sets gradients of the leaves past autograd's accumulation (zero bubble's
        weight half: ``split_backward.py``), so no hook sees them: what it added is summed over
        the ranks when it returns, every bucket at once, as a backward's end would."""
        if self.defer:
            run()
            return
        if not self._held:
            self._held = True
            self._base = {id(leaf): leaf.grad.clone() for _, leaf in self.leaves if leaf.grad is not None}
        run()
        for b in range(len(self.buckets)):
            self._launch(b)
        self._ready = [0] * len(self.buckets)
        self._finish()

    def _queue(self) -> None:
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_deferred if self.defer
                                                                     else self._finish)

    def abandon(self) -> None:
        """Close an accumulation window a failed step left open (its gradients stay as they are)."""
        self._base.clear()
        self._held = self._queued = self._started = False
        self._ready = [0] * len(self.buckets)

    def _end_deferred(self) -> None:
        """The end of a backward under ``defer``: its gradients stay local, added to by the next."""
        self._ready = [0] * len(self.buckets)
        self._queued = False
        self._started = False

    def _begin(self, grad):
        if not self._started:
            self._started = True
            self._queue()
            if not self._held:  # once per accumulation window: what the window adds is reduced
                self._held = True
                for bucket in self.buckets:
                    for leaf in bucket:
                        if leaf.grad is not None:
                            self._base[id(leaf)] = leaf.grad.clone()
        return grad

    def _on_grad(self, leaf: torch.Tensor) -> None:
        self._queue()
        if self.defer:
            return
        b = self.bucket_of.get(id(leaf))
        if b is None:
            return
        self._ready[b] += 1
        if self._ready[b] == len(self.buckets[b]):
            self._launch(b)

    def _views(self, b: int) -> list[torch.Tensor]:
        """The bucket's flat buffer (made once, as DDP's buckets are: a fresh 25 MiB allocation
        every step costs more than the copy) cut into one view per gradient."""
        if b not in self._buffers:
            leaves = self.buckets[b]
            z = self.shards.get(b)  # ZeRO: padded to equal slices, the padding zeros
            buf = torch.zeros(z.numel, dtype=leaves[0].dtype, device=leaves[0].device) if z is not None else \
                torch.empty(sum(leaf.numel() for leaf in leaves), dtype=leaves[0].dtype, device=leaves[0].device)
            views, offset = [], 0
            for leaf in leaves:
                views.append(buf[offset:offset + leaf.numel()].view_as(leaf))
                offset += leaf.numel()
            self._buffers[b] = (buf, views)
        return self._buffers[b][1]

    def _launch(self, b: int) -> None:
        if self.gated:  # ZeRO-3 per unit: one reduce-scatter's buffer in flight at a time
            self._drain()
        views = self._views(b)
        for leaf, view in zip(self.buckets[b], views):
            if leaf.grad is None:
                view.zero_()  # unused this step: adds nothing
                continue
            if leaf.grad.data_ptr() != view.data_ptr():
                view.copy_(leaf.grad)
            base = self._base.get(id(leaf))
            if base is not None:
                view.sub_(base)  # only what this backward added is summed over the ranks
        buf = self._buffers[b][0]
        z = self.shards.get(b)
        if self.zero >= 2 and z is not None:
            z.incoming = torch.empty(z.slice, dtype=buf.dtype, device=buf.device)
            self._work.append((dist.reduce_scatter_single(z.incoming, buf, group=z.group, async_op=True), b))
            if self.gated:
                self._unit_done(b, z)
            return
        self._work.append((dist.all_reduce(buf, group=self.groups[self.bucket_axes[b]], async_op=True), b))

    def _unit_done(self, b: int, z) -> None:
        """ZeRO-3 per unit, once bucket ``b``'s reduce-scatter is started: the backward is done
        with its parameters (freed) and its gradients (in the bucket's buffer now)."""
        from .zero import release

        if b not in self.kept:
            release(z)
        for leaf in self.buckets[b]:
            leaf.grad = None

    def _drain(self) -> None:
        """Wait for the sliced buckets' reduce-scatters under way and free their buffers, before
        the next bucket's buffer is made: a rank holds two units' whole gradients at most (the
        one the backward makes, copied into its buffer; ``zero3_gathered`` prices it so)."""
        keep = []
        for work, earlier in self._work:
            if earlier not in self.shards:
                keep.append((work, earlier))
                continue
            work.wait()
            self._shard_grad(earlier, self.shards[earlier])
        self._work[:] = keep

    def _finish(self) -> None:
        for b, count in enumerate(self._ready):
            if 0 < count < len(self.buckets[b]):  # a parameter unused this step: reduce what came
                self._launch(b)
        for work, b in self._work:
            work.wait()
            z = self.shards.get(b)
            if z is not None:
                self._shard_grad(b, z)
                if self.zero >= 2:
                    continue
            for leaf, view in zip(self.buckets[b], self._buffers[b][1]):
                if leaf.grad is None:
                    continue
                base = self._base.get(id(leaf))
                if base is not None:
                    view.add_(base)
                leaf.grad = view  # the reduced gradient, in the bucket (no copy back)
        with torch.no_grad():  # the DTensor parameters' gradients: views of the local ones
            for p, leaf in self.leaves:
                g = leaf.grad
                if g is not None and (p.grad is None or p.grad._local_tensor is not g):
                    p.grad = as_grad(p, g)
        if self.zero == 3:  # the backward is done with the whole parameters
            self.release_params(self.kept)
        self._work.clear()
        self._base.clear()
        self._held = False
        self._ready = [0] * len(self.buckets)
        self._queued = False
        self._started = False

    def _shard_grad(self, b: int, z) -> None:
        """ZeRO: this rank's slice of the bucket's summed gradient as its master slice's gradient
        (stage 2: what the reduce-scatter brought, summed over the other axes, added to what an
        earlier backward left; the parameters keep no gradient)."""
        if self.zero == 1:
            z.master.grad = self._buffers[b][0][z.rank * z.slice:(z.rank + 1) * z.slice]
            return
        if z.rest is not None:
            dist.all_reduce(z.incoming, group=z.rest)
        if z.master.grad is None:  # bf16 under mixed precision's ZeRO-3: the master's gradient fp32
            z.master.grad = z.incoming.to(z.master.dtype)
        else:
            z.master.grad.add_(z.incoming)
        z.incoming = None
        self._buffers.pop(b, None)  # the whole bucket only lives for its reduce-scatter
        for leaf in self.buckets[b]:
            leaf.grad = None

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()


def finish_loss(loss: torch.Tensor, spec: ReshardSpec, scale: float = 1.0) -> torch.Tensor:
    """Backward from a loss left as this rank's term (``OutputReshard`` deferred) and its whole
    value: a sum over the partial axes is started asynchronously before the backward (gloo runs
    it beside the backward's compute), waited for after; another move runs after the backward.
    ``scale``: the backward runs on ``scale`` times the loss (a microbatch of accumulation)."""
    value = loss.detach().clone()
    axes = partial_axes(spec.src)
    summed = all(p.is_replicate() or is_sum(p) for p in spec.src)
    work = dist.all_reduce(value, group=_group(spec.mesh, axes), async_op=True) if summed and axes else None
    (loss * scale if scale != 1.0 else loss).backward()
    if work is not None:
        work.wait()
        return value
    with torch.no_grad():
        return move(value, spec.mesh, spec.src, spec.dst, spec.shape)


def partial_axes(placements: Placements) -> tuple[int, ...]:
    return tuple(a for a, p in enumerate(placements) if isinstance(p, Partial))


def shard_dims(placements: Placements) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for a, p in enumerate(placements):
        if isinstance(p, Shard):
            out.setdefault(p.dim, []).append(a)
    return out


def as_grad(p: DTensor, g: torch.Tensor) -> DTensor:
    """``g`` (this rank's gradient of ``p``, or a tensor of its optimizer state) as a DTensor
    laid out as ``p``. Where it has the local
    tensor's layout, built on ``p``'s own spec: ``DTensor.from_local`` takes 23 us a tensor (0.7 ms
    a step for the gpt's 29 parameters, every step, as the optimizer's ``zero_grad`` drops them),
    the bare constructor 3 us."""
    local = p._local_tensor
    if g.shape == local.shape and g.stride() == local.stride() and g.dtype == local.dtype:
        return DTensor(g, p._spec, requires_grad=False)
    return DTensor.from_local(g, p.device_mesh, p.placements, run_check=False)
