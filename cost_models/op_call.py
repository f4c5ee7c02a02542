"""A node's op as one device runs it: its operands cut by a config, made as random tensors.

``OpCall`` is what a runner (``cost_models/runners.py``) returns and ``op_runner.time_op`` times;
``local_shape`` is the shard of one operand a device holds under a config.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from autopar.core.ir import Node, TensorSpec
from autopar.core.tables import Config

FLOAT = {"float64", "float32", "float16", "bfloat16"}


class NotRunnable(Exception):
    """The runner has no way to execute this op; the message says why."""


def local_shape(node: Node, config: Config, spec: TensorSpec) -> tuple[int, ...]:
    """The shard of ``spec`` one device holds under ``config``: each axis / its dims' splits."""
    split = {d.name: s for d, s in zip(node.dims, config.splits)}
    return tuple(max(1, size // math.prod(split.get(n, 1) for n in names))
                 for size, names in zip(spec.shape, spec.axes))


@dataclass
class OpCall:
    """A ready-to-time op: ``fn(*tensors)`` returns a tensor or a tuple of them."""

    fn: Callable
    tensors: list[torch.Tensor]
    params: tuple = ()  # leaves that are not arguments (an nn.LSTM's weights)


def make_tensor(shape, dtype: str, device, high: int | None = None) -> torch.Tensor:
    """Random values of ``shape``: floats that need a gradient, bools, or integers below ``high``."""
    if dtype in FLOAT:
        return torch.randn(shape, dtype=getattr(torch, dtype), device=device, requires_grad=True)
    if dtype == "bool":
        return torch.rand(shape, device=device) > 0.5
    return torch.randint(0, max(1, high or 2), shape, dtype=getattr(torch, dtype), device=device)
