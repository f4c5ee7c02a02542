"""What the cost model prices for a gradient reduction's bucket copy is what the runtime copies.

``training.bucket_copy_time`` prices, per gradient reduction, a plain copy of the gradient's
bytes into its bucket's flat buffer. Counted here on the generated data-parallel module's
backward, by torch's own dispatch: the bytes ``aten.copy_`` writes into the reducer's buffers
(an MLP, one rank of two on torch's fake process group, whose collectives move nothing, so every
copy counted is the runtime's) are the trainable parameters' bytes, once a backward.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import autopar
from autopar.cli.measure import fake_group
from autopar.codegen.module import shard_module
from tests.helpers.plans import data_parallel


class _Copies(TorchDispatchMode):
    """Bytes ``aten.copy_`` writes, by destination storage."""

    def __init__(self):
        super().__init__()
        self.into: dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.copy_.default:
            dst = args[0]
            key = dst.untyped_storage().data_ptr()
            self.into[key] = self.into.get(key, 0) + dst.numel() * dst.element_size()
        return out


def test_the_buckets_copy_every_gradient_once_a_backward():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 8))
    x = torch.randn(8, 32)
    graph = autopar.trace(model, (x,))
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with fake_group(0, 2):
        module = shard_module(model, graph, data_parallel(graph, (2,)), (2,))
        module(x).sum().backward()  # the buckets' buffers are made on the first backward
        for _ in range(2):
            for p in module.parameters():
                p.grad = None
            with _Copies() as seen:
                module(x).sum().backward()
            buffers = {buf.untyped_storage().data_ptr() for buf, _ in module.reducer._buffers.values()}
            assert buffers and sum(n for k, n in seen.into.items() if k in buffers) == grad_bytes
