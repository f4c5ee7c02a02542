"""``compile`` outside the happy path: a Python number among the forward's positional inputs, a
model built on the meta device, and ranks that each pass their own batch where every rank should
pass the same global one. Each either works (and trains like one device) or says what to do in
one line; none fails from inside torch or trains on silently wrong numbers."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import autopar
from autopar.codegen.batch_check import differing_inputs
from tests.helpers.dist_utils import run_threaded
from tests.helpers.numerics import check_module, reference_run


class Scaled(nn.Module):
    """``forward(x, y, scale: float = 1.0)``: a float beside the tensors, positional."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.out = nn.Linear(16, 8)

    def forward(self, x, y, scale: float = 1.0):
        return ((self.out(torch.relu(self.fc(x))) * scale - y) ** 2).mean()


def _scaled():
    torch.manual_seed(0)
    return Scaled(), (torch.randn(8, 8), torch.randn(8, 8), 0.5)


def _scaled_rank(rank, world, model, inputs, ref):
    module = autopar.compile(model, world, inputs)
    check_module(rank, module, inputs, ref)
    with pytest.raises(ValueError, match="fixed in the traced graph") as info:  # so is the float
        module(*inputs[:2], 2.0)
    assert "\n" not in str(info.value)


def test_a_float_positional_input_compiles_and_trains_like_one_device():
    model, inputs = _scaled()
    run_threaded(_scaled_rank, 2, model, inputs, reference_run(model, inputs))


def test_a_model_on_the_meta_device_is_refused_at_compile_in_one_line():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    x = torch.randn(4, 8)
    autopar.plan(model, (x,), devices=2)  # planning a model without weights is what meta is for
    for devices, inputs in [(1, (x,)), (2, (x,)), (2, None)]:  # None: planned at the first call
        with pytest.raises(ValueError, match="meta device") as info:
            autopar.compile(model, devices, inputs)
        assert "\n" not in str(info.value) and "to_empty" in str(info.value)


def _own_batches(rank, world, model, x):
    same = autopar.compile(model, world, (x,))
    same(x)  # the same global batch on every rank: no complaint
    own = autopar.compile(model, world)  # planned at its first call
    with pytest.raises(ValueError, match="inputs='local'") as info:
        own(x + rank)  # the DDP habit: each rank loads its own batch
    assert "\n" not in str(info.value)
    return [differing_inputs([("x", x if rank == 0 else x.flip(0))], own.mesh),  # rows in another order
            differing_inputs([("x", x), ("y", x)], own.mesh)]


def test_ranks_that_pass_different_global_batches_are_told_to_use_local_inputs():
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)), torch.randn(4, 8)
    for reordered, same in run_threaded(_own_batches, 2, model, x):
        assert reordered == ["x"]  # the plain sum agrees; the fingerprint's weighted sum does not
        assert same == []
