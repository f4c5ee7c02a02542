"""Training-mode batch norm with its batch split: statistics over the whole batch.

The IR lets ``b`` of a batch norm split freely (PaSE prices it that way). Run locally, each device
would normalize with the statistics of its own slice of the batch, which is a different model
(that is why DDP has ``SyncBatchNorm``). Here the statistics are made global with DTensor's own
collectives, so the sharded module computes exactly what the single-device model does:

1. per-channel partial sums of ``x / N`` on each device -> ``Partial`` on the batch axes;
2. ``redistribute`` to ``Replicate`` (an all-reduce of C numbers): the global mean;
3. the same for ``(x - mean)^2 / N``: the global biased variance (two passes, as torch does, for
   precision);
4. normalize the local slice with them.

Autograd runs backward through the same redistributes, so the gradient is that of the global
statistics too. Running statistics are updated in place like ``nn.BatchNorm*`` does (unbiased
variance, ``momentum``), on every device identically.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.experimental import local_map

from autopar.core.ir import Node

from .placements import NodeLayout, Placements, grad_placements


def needs_sync(node: Node, layout: NodeLayout, module: nn.Module | None) -> bool:
    """A training batch norm module whose batch dim some mesh axis cuts."""
    if node.op != "batch_norm" or not isinstance(module, nn.modules.batchnorm._BatchNorm):
        return False
    if not (module.training or not module.track_running_stats):
        return False
    batch = node.dims[0].name
    return any(d == batch for d in layout.axis_dims)


def sync_batch_norm(module: nn.modules.batchnorm._BatchNorm, x: DTensor, node: Node,
                    layout: NodeLayout, mesh: DeviceMesh) -> DTensor:
    owner = list(layout.axis_dims)
    batch, channel = node.dims[0].name, node.dims[1].name
    xp = layout.inputs[0]
    cvec: Placements = tuple(Shard(0) if d == channel else Replicate() for d in owner)
    cpart: Placements = tuple(Partial() if d == batch else p for d, p in zip(owner, cvec))
    cgrad = grad_placements(cvec, owner)
    spec = node.inputs[0].spec
    count = spec.numel // spec.shape[1]  # elements per channel, whole batch
    reduce_dims = [i for i in range(len(spec.shape)) if i != 1]

    def bcast(v: torch.Tensor, nd: int) -> torch.Tensor:
        return v.view(1, -1, *([1] * (nd - 2)))

    def local_mean(xl):
        return xl.sum(dim=reduce_dims) / count

    def local_var(xl, mean):
        return ((xl - bcast(mean, xl.ndim)) ** 2).sum(dim=reduce_dims) / count

    def normalize(xl, mean, var, *affine):
        y = (xl - bcast(mean, xl.ndim)) * bcast(torch.rsqrt(var + module.eps), xl.ndim)
        if affine:
            y = y * bcast(affine[0], xl.ndim) + bcast(affine[1], xl.ndim)
        return y

    x = x.redistribute(mesh, xp)
    mean = local_map(local_mean, out_placements=(cpart,), in_placements=(xp,),
                     in_grad_placements=(xp,), device_mesh=mesh)(x).redistribute(mesh, cvec)
    var = local_map(local_var, out_placements=(cpart,), in_placements=(xp, cvec),
                    in_grad_placements=(xp, cgrad), device_mesh=mesh)(x, mean)
    var = var.redistribute(mesh, cvec)
    affine = [t.redistribute(mesh, cvec) for t in (module.weight, module.bias) if t is not None]
    y = local_map(normalize, out_placements=(xp,), in_placements=(xp, cvec, cvec) + (cvec,) * len(affine),
                  in_grad_placements=(xp, cgrad, cgrad) + (cgrad,) * len(affine),
                  device_mesh=mesh)(x, mean, var, *affine)
    if module.training and module.track_running_stats:
        _update_running(module, mean, var, count)
    return y


@torch.no_grad()
def _update_running(module, mean: DTensor, var: DTensor, count: int) -> None:
    module.num_batches_tracked.add_(1)
    m = module.momentum
    if m is None:  # cumulative moving average, as nn.BatchNorm does
        m = 1.0 / float(module.num_batches_tracked.full_tensor().item())
    unbiased = var.to_local() * (count / max(count - 1, 1))
    rm, rv = module.running_mean.to_local(), module.running_var.to_local()
    rm.mul_(1 - m).add_(mean.to_local().detach(), alpha=m)
    rv.mul_(1 - m).add_(unbiased.detach(), alpha=m)


def needs_sync_op(n, node: Node, layout: NodeLayout) -> bool:
    """A training ``aten.batch_norm`` call (a torch.export graph) whose batch dim is cut."""
    import torch._ops

    if node.op != "batch_norm" or not isinstance(n.target, torch._ops.OpOverload):
        return False
    if n.target.overloadpacket.__name__ != "batch_norm" or not bool(_arg(n, 5, "training", False)):
        return False
    batch = node.dims[0].name
    return any(d == batch for d in layout.axis_dims)


def _arg(n, i: int, key: str, default):
    return n.args[i] if len(n.args) > i else n.kwargs.get(key, default)


def sync_batch_norm_local(x, weight, bias, running_mean, running_var, momentum: float, eps: float,
                          node: Node, layout: NodeLayout, mesh: DeviceMesh):
    """``aten.batch_norm`` in training with its batch split, on local tensors: the statistics
    summed over the batch axes (DTensor's all-reduce, differentiable), the affine parameters read
    locally (their gradients are partial over the batch axes and the gradient reducer sums them),
    the running statistics updated in place as the single-device op does."""
    owner = list(layout.axis_dims)
    batch, channel = node.dims[0].name, node.dims[1].name
    cvec: Placements = tuple(Shard(0) if d == channel else Replicate() for d in owner)
    cpart: Placements = tuple(Partial() if d == batch else p for d, p in zip(owner, cvec))
    spec = node.inputs[0].spec
    count = spec.numel // spec.shape[1]
    dims = [i for i in range(x.dim()) if i != 1]
    shape = (1, -1) + (1,) * (x.dim() - 2)

    cgrad = grad_placements(cvec, owner)  # each rank's use of the totals adds to their gradient

    def total(local):
        return DTensor.from_local(local, mesh, cpart, run_check=False).redistribute(mesh, cvec).to_local(
            grad_placements=cgrad)

    mean = total(x.sum(dim=dims) / count)
    var = total(((x - mean.view(shape)) ** 2).sum(dim=dims) / count)
    y = (x - mean.view(shape)) * torch.rsqrt(var + eps).view(shape)
    if weight is not None:
        y = y * weight.view(shape)
    if bias is not None:
        y = y + bias.view(shape)
    if running_mean is not None and running_var is not None:
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
            running_var.mul_(1 - momentum).add_(var.detach() * (count / max(count - 1, 1)), alpha=momentum)
    return y
