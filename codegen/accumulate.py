"""Gradient accumulation in the generated program: one ``train_step`` runs the batch as ``k``
equal microbatches, one after another, and synchronizes the gradients once.

Each microbatch runs the program built for its size (``batches.py``) with its own forward and
backward, so a rank holds one microbatch's activations at a time. The gradient reducer
(``runtime.GradReducer``) is told to ``defer`` during the first ``k - 1`` backwards: their
gradients add up in the parameters' local ``.grad`` and no bucket is reduced; the last backward
reduces every bucket once, holding the sum of the ``k`` backwards (what the step added, as without
accumulation). The optimizer steps once after ``train_step``, as usual.

Losses: a model's loss averaged over its batch (``loss_reduction="mean"``, the default, as
``pipeline.PipelinedModule``) is the mean of the microbatches' losses, so each backward runs on
``loss / k`` and the step returns the mean; a summed loss (``"sum"``) runs unscaled and the step
returns the sum.
"""

from __future__ import annotations

import torch


def microbatches(args: tuple, kwargs: dict, k: int) -> list[tuple[tuple, dict]]:
    """The call cut into ``k`` equal microbatches along dim 0 of its batched tensors (those whose
    first dim is the first tensor's); a one-line ValueError when ``k`` does not divide it."""
    tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor) and v.dim()]
    if not tensors:
        raise ValueError("gradient accumulation needs a batched tensor input to cut into microbatches")
    batch = tensors[0].shape[0]
    if batch % k:
        raise ValueError(f"batch {batch} does not split into {k} equal microbatches of gradient "
                         f"accumulation: pass a batch divisible by {k}, or plan with that batch")

    def cut(v, i):
        if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == batch:
            return v.chunk(k)[i]
        return v

    return [(tuple(cut(a, i) for a in args), {n: cut(v, i) for n, v in kwargs.items()}) for i in range(k)]


def accumulated_step(module, args: tuple, kwargs: dict, k: int, reduction: str = "mean") -> torch.Tensor:
    """``k`` forwards and backwards of ``module`` (a ``CompiledModule``), the gradients reduced
    once after the last; the whole batch's (detached) loss."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"loss_reduction must be 'mean' or 'sum', not {reduction!r}")
    scale = 1.0 / k if reduction == "mean" else 1.0
    parts = microbatches(args, kwargs, k)
    total = None
    reducer = module.reducer
    try:
        for i, (a, kw) in enumerate(parts):
            reducer.defer = i < k - 1
            loss = module.one_step(a, kw, scale)
            total = loss if total is None else total + loss
    except BaseException:
        reducer.abandon()  # a step that failed half way leaves no accumulation window open
        raise
    finally:
        reducer.defer = False
    return total * scale
