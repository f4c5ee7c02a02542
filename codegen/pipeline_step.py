"""One step of a pipelined module through its ``torch.distributed.pipelining`` schedule, shared
by one stage per rank (``pipeline.PipelinedModule``) and interleaved 1F1B
(``interleaved.InterleavedModule``): the inputs checked and moved to the rank's device, the batch
checked against the microbatch count, the schedule run, and the loss (the last stage's mean or
sum over the microbatches) broadcast from its rank so that every rank returns it."""

from __future__ import annotations

import torch
import torch.distributed as dist


def run_step(module, run, inputs: tuple, positional: bool) -> torch.Tensor:
    """``run`` (the schedule's ``step`` or ``eval``) over the whole batch ``inputs``, the model's
    traced inputs in order; ``positional``: this rank's first stage takes them by position (the
    first stage of a one-stage-per-rank pipeline), else every stage takes them by name.
    ``module`` holds ``input_names``, ``microbatches``, ``loss_reduction``, ``is_last`` and the
    loss's rank, group, device and meta tensor."""
    if len(inputs) != len(module.input_names):
        raise TypeError(f"the pipelined model takes its {len(module.input_names)} traced inputs "
                        f"{module.input_names} in order, got {len(inputs)}")
    device = module._device
    inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
    batch = next((x.shape[0] for x in inputs if isinstance(x, torch.Tensor) and x.dim()), None)
    if batch is not None and batch % module.microbatches:
        raise ValueError(f"batch {batch} does not split into {module.microbatches} equal microbatches")
    losses: list[torch.Tensor] = []
    # the loss is the last stage's output; the schedule still wants a target to chunk
    common = dict(target=torch.zeros(module.microbatches, device=device), losses=losses, return_outputs=False)
    if positional:
        run(*inputs, **common)
    else:  # keyword inputs reach every stage; positional ones only the first
        run(**common, **dict(zip(module.input_names, inputs)))
    if module.is_last:
        loss = torch.stack([x.detach() for x in losses])
        loss = loss.mean() if module.loss_reduction == "mean" else loss.sum()
        loss = loss.to(module._loss_meta.dtype)  # mixed precision: the model's own dtype, as broadcast
    else:
        loss = torch.empty(module._loss_meta.shape, dtype=module._loss_meta.dtype, device=device)
    dist.broadcast(loss, src=module._loss_rank, group=module._group)
    return loss
