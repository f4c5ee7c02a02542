"""Zero bubble's split backward on a pipeline stage sharded over several devices.

Zero bubble (ZB-H1, ``ScheduleInterleavedZeroBubble``) runs each microbatch's backward in two
halves: ``I``, the gradients of the stage's inputs (sent on at once), and ``W``, the weights' (run
where 1F1B would idle). torch's ``PipelineStage`` takes the weights to be ``submod.parameters()``:
``I`` records the autograd nodes between the inputs and those weights, ``W`` runs the backward from
them into the weights' ``.grad``. A sharded stage's module (``module.CompiledModule``) has DTensor
parameters that its program never reads: it reads their local tensors, made leaves of autograd for
``runtime.GradReducer``. With those DTensors as the weights, ``I`` finds none of them in the graph
and ``W`` computes nothing, so every stage but the first (whose ``W`` is a whole backward) kept no
gradient at all. Here both halves take the program's leaves; and since torch's ``W`` sets their
``.grad`` itself (no accumulation hook fires, so the reducer's buckets never fill), the reducer
sums what ``W`` added over the stage's data-parallel ranks when it returns.

A stage under pointwise recomputation (``selective.py``) runs its whole backward in ``I`` and
nothing in ``W``: torch's selective checkpoint hands each kept matmul output to one backward only,
and ``W`` would be a second one through the same blocks ("Trying to backward an extra time").
The schedule's order, and so its gradients, stay the same; the stage's ``W`` slots idle.
So does a stage under ZeRO-3: ``I`` regathers each block for its backward and frees it once
its gradients are in (``zero_units.py``), and ``W`` would read some weights again (LayerNorm's
weight gradient reads its weight), a third gather of each block per microbatch where the price
counts two (``cost_models.training.zero_collectives``), or every block of the stage held whole
from ``I`` to ``W`` where it counts two.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight


class LeafStage(PipelineStage):
    """A ``PipelineStage`` over a ``CompiledModule`` whose split backward reaches its leaves."""

    def _leaves(self) -> list[torch.Tensor]:
        return [leaf for _, leaf in self.submod.reducer.leaves]

    def scale_grads(self, grad_scale_factor: int) -> None:
        """The mean over the microbatches: under ZeRO-2/3 the sliced parameters keep no ``.grad``,
        their gradient is this rank's master slice's (ZeRO-1's master slices view the gradients
        scaled here already)."""
        super().scale_grads(grad_scale_factor)
        reducer = self.submod.reducer
        if grad_scale_factor != 1 and reducer.zero >= 2:
            for z in reducer.shards.values():
                if z.master.grad is not None:
                    z.master.grad.div_(grad_scale_factor)

    def _one_backward(self) -> bool:
        """Does the stage run each microbatch's backward whole in ``I``: its program's blocks under
        selective checkpointing, or its parameters stored sliced (ZeRO-3)?"""
        return self.submod.reducer.zero == 3 or \
            any(getattr(m, "pointwise", False) for m in self.submod.program.module.modules())

    def backward_maybe_with_nosync(self, backward_type: str, bwd_kwargs: dict,
                                   last_backward: bool = False) -> tuple[tuple[Any, ...], Any]:
        if backward_type in ("input", "weight") and self._one_backward():  # one backward: ``I``
            if backward_type == "weight":
                return (), None
            if bwd_kwargs["output_grads"] is None and isinstance(bwd_kwargs["stage_output"], tuple):
                # the last stage's loss, made a tuple for ``I``: torch's full backward skips a
                # tuple without gradients, so each output gets its own (None: a scalar loss's 1)
                bwd_kwargs = {**bwd_kwargs, "output_grads": (None,) * len(bwd_kwargs["stage_output"])}
            return super().backward_maybe_with_nosync("full", bwd_kwargs, last_backward)
        if backward_type == "input":
            return stage_backward_input(bwd_kwargs["stage_output"], bwd_kwargs["output_grads"],
                                        bwd_kwargs["input_values"], iter(self._leaves()))
        if backward_type == "weight":
            leaves = self._leaves()
            grads: list[tuple] = []
            self.submod.reducer.reduce_added(
                lambda: grads.append(stage_backward_weight(iter(leaves), bwd_kwargs["param_groups"])))
            return grads[0], None
        return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)
