"""Bytes the dispatcher's copies write (clone, copy_, _to_copy; ``contiguous`` dispatches as a
clone): what a reshard or a move is checked to copy, against the tensor's own bytes."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

COPIES = (torch.ops.aten.clone, torch.ops.aten.copy_, torch.ops.aten._to_copy)


class CopiedBytes(TorchDispatchMode):
    """Within the ``with`` block, ``nbytes`` sums the outputs of every copy that runs."""

    def __init__(self):
        super().__init__()
        self.nbytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in COPIES and isinstance(out, torch.Tensor):
            self.nbytes += out.numel() * out.element_size()
        return out
