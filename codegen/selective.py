"""Pointwise recomputation in the program: each recomputed block under torch's selective
activation checkpointing, its matmuls' and fused attentions' outputs kept, every other op run
again in the backward (``core/selective.py`` names the same ops at the IR level, which is what
the memory and time models price).

The policy is torch's (``create_selective_checkpoint_contexts``): MUST_SAVE for the ops below,
PREFER_RECOMPUTE for everything else, collectives included (a reshard feeding a recomputed op
runs again, as the cost model prices it). Non-reentrant ``checkpoint`` keeps the block's inputs.
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

aten = torch.ops.aten
# the aten ops a linear, matmul, einsum or convolution lowers to, and the fused attention kernels
# (their output and log-sum-exp: all of a kernel's outputs are cached)
KEPT_ATEN = frozenset(op for op in (
    aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten.convolution.default,
    aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_efficient_attention.default,
    getattr(aten, "_scaled_dot_product_cudnn_attention", None) and aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default) if op is not None)


def keep_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Torch's selective-checkpoint policy of pointwise recomputation."""
    return CheckpointPolicy.MUST_SAVE if op in KEPT_ATEN else CheckpointPolicy.PREFER_RECOMPUTE


def pointwise_checkpoint(fn, *args):
    """``fn(*args)`` under non-reentrant checkpointing with ``keep_matmuls``'s selective contexts."""
    return checkpoint(fn, *args, use_reentrant=False,
                      context_fn=functools.partial(create_selective_checkpoint_contexts, keep_matmuls))
