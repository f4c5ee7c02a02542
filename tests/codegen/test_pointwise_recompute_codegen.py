"""Pointwise recomputation in codegen: each repeated block of a Llama runs under torch's selective
checkpointing (``codegen/selective.py``: the matmuls' and the fused attention's outputs kept,
everything else, the tensor-parallel collectives included, run again in the backward), and a
tensor-parallel plan trains like one device (float64: the loss at every step, every gradient and
every parameter after 3 AdamW steps)."""

from __future__ import annotations

import copy

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import autopar
from autopar.codegen.selective import KEPT_ATEN, keep_matmuls
from tests.helpers.dist_utils import run_threaded
from tests.helpers.numerics import check_module, reference_run

LAYERS = 2


class _Matmuls(TorchDispatchMode):
    """The matmuls run while active."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default)
        return func(*args, **(kwargs or {}))


def _backward_matmuls(model, inputs, plan, **override) -> int:
    module = autopar.compile(copy.deepcopy(model), inputs, plan=plan, **override)
    loss = module(*inputs)
    mode = _Matmuls()
    with mode:
        loss.backward()
    return mode.count


def _check(rank, world, model, inputs, plan, ref):
    """The blocks wrapped; the backward runs no matmul again (as many as without recomputation,
    fewer than with every block's forward again); the training matches one device's."""
    module = autopar.compile(copy.deepcopy(model), inputs, plan=plan)
    wrapped = [m for m in module.program.module.modules() if type(m).__name__ == "Recomputed"]
    assert [m.pointwise for m in wrapped] == [True] * LAYERS, wrapped
    plain, full = (_backward_matmuls(model, inputs, plan, recompute=rc) for rc in (False, True))
    assert _backward_matmuls(model, inputs, plan) == plain < full
    check_module(rank, module, inputs, ref)


def test_a_tensor_parallel_plan_with_pointwise_recompute_trains_like_one_device():
    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("llama", batch=4, seq=16, width=32, heads=2, kv_heads=2, ffn=64,
                                    layers=LAYERS, vocab=64)
    model = model.double()
    cluster = autopar.Cluster.preset("cpu", devices=2)
    plan = autopar.plan(model, inputs, cluster, hierarchical=True, zero=0,
                        pin="tensor=2,pipeline=1,recompute=pointwise").baselines["published"]
    assert plan.strategy.options.recompute == "pointwise" and plan.strategy.degrees.t == 2
    assert plan.strategy.recompute == tuple(f"blocks.{i}" for i in range(LAYERS))
    run_threaded(_check, 2, model, inputs, plan, reference_run(model, inputs))


def test_the_policy_keeps_the_matmuls_and_recomputes_the_rest():
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    assert keep_matmuls(None, aten.mm.default) == CheckpointPolicy.MUST_SAVE
    assert aten._scaled_dot_product_flash_attention_for_cpu.default in KEPT_ATEN
    for op in (aten.mul.Tensor, aten.silu.default, aten.rsqrt.default, aten._to_copy.default):
        assert keep_matmuls(None, op) == CheckpointPolicy.PREFER_RECOMPUTE
