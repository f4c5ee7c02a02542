"""K models' losses at once: each model's loss reduced over its own elements only.

The fused graph computes the loss without reduction on the K models' predictions laid end to
end, then reduces per model, the way torch reduces one model's loss: ``mean`` divides by the
model's element count, or, for class-index targets, by the summed class weights of the targets
that are not ``ignore_index``. The result is a (K,) tensor of losses; their sum has the K
models' gradients, each in its own parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _reduce(loss: torch.Tensor, k: int, reduction: str, denom: torch.Tensor | None = None) -> torch.Tensor:
    if reduction == "none":
        return loss
    per_model = loss.reshape(k, -1)
    if reduction == "sum":
        return per_model.sum(1)
    if reduction != "mean":
        raise ValueError(f"unknown reduction {reduction!r}")
    return per_model.sum(1) / denom if denom is not None else per_model.mean(1)


def class_loss(fn, input, target, k: int, target_stacked: bool, unbatched: bool, weight=None,
               ignore_index: int = -100, reduction: str = "mean", **kwargs) -> torch.Tensor:
    """cross_entropy / nll_loss: input (K, N, C, ...), or (K, C) for one unbatched sample."""
    if not target_stacked:
        target = target.unsqueeze(0).expand((k,) + target.shape)
    if unbatched:  # (K, C) with one class index per model: the K models are the batch
        x, t = input, target
    else:
        x, t = input.flatten(0, 1), target.flatten(0, 1)
    loss = fn(x, t, weight=weight, ignore_index=ignore_index, reduction="none", **kwargs)
    if reduction == "none":
        return loss if unbatched else loss.unflatten(0, (k, -1))
    denom = None
    if not t.is_floating_point():  # class indices: torch's mean is over the counted targets
        keep = (t != ignore_index).reshape(k, -1)
        if weight is None:
            denom = keep.sum(1).to(loss.dtype)
        else:
            denom = (weight[t.clamp(min=0)].reshape(k, -1) * keep).sum(1)
    return _reduce(loss, k, reduction, denom)


def cross_entropy(input, target, k: int, target_stacked: bool, unbatched: bool, weight=None,
                  ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0) -> torch.Tensor:
    return class_loss(F.cross_entropy, input, target, k, target_stacked, unbatched, weight, ignore_index, reduction,
                      label_smoothing=label_smoothing)


def nll_loss(input, target, k: int, target_stacked: bool, unbatched: bool, weight=None, ignore_index: int = -100,
             reduction: str = "mean") -> torch.Tensor:
    return class_loss(F.nll_loss, input, target, k, target_stacked, unbatched, weight, ignore_index, reduction)


def elementwise_loss(name: str, input, target, k: int, reduction: str = "mean", **kwargs) -> torch.Tensor:
    """``F.<name>`` (mse_loss, l1_loss, huber_loss, binary_cross_entropy, ...): input (K, ...),
    target broadcast to it."""
    loss = getattr(F, name)(input, target.expand_as(input) if target.dim() <= input.dim() else target,
              reduction="none", **kwargs)
    return _reduce(loss, k, reduction)
