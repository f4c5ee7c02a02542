"""A reshard step copies its buffer once, whatever the strides it gets: the one copy the cost model
prices (``alpha_beta.reshard_local``). A gradient of a permuted view reaches a reshard's backward
strided (the gpt's attention heads); copies are counted at the dispatcher, one training step on a
fake group of two ranks, against the bytes of the tensor moved."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate

from autopar.cli.measure import fake_group
from autopar.codegen.moves import move
from autopar.codegen.runtime import Reshard, ReshardSpec
from tests.helpers.copies import CopiedBytes


def test_a_strided_partial_sum_is_copied_once_before_its_all_reduce():
    with fake_group(0, 2):
        mesh = init_device_mesh("cpu", (2,))
        x = torch.randn(16, 32).t()  # strided
        with CopiedBytes() as c:
            y = move(x, mesh, (Partial(),), (Replicate(),))
    assert y.is_contiguous() and y.shape == x.shape
    assert c.nbytes == x.numel() * x.element_size()


def test_a_strided_gradient_is_copied_once_by_its_reshard_backward():
    with fake_group(0, 2):
        mesh = init_device_mesh("cpu", (2,))
        # forward: nothing to move; backward: the reader's partial gradient summed to a replica
        reshard = Reshard(ReshardSpec(mesh, (Replicate(),), (Replicate(),), (Partial(),), (Replicate(),)))
        x = torch.randn(16, 32, requires_grad=True)
        w = torch.randn(32, 16)
        loss = (reshard(x).t() * w).sum()  # the gradient reaching the reshard is w's transpose: strided
        with CopiedBytes() as c:
            loss.backward()
    assert x.grad is not None and x.grad.shape == x.shape
    assert c.nbytes == x.numel() * x.element_size()
