"""Attention-only recomputation in codegen: each attention core of a Llama with explicit
attention runs under torch.utils.checkpoint (one ``Recomputed`` per core), the rank keeps fewer
bytes for the backward, and 2 gloo processes train like one device (float64: loss, gradients)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.tensor import DTensor

import autopar
from autopar.core.cluster import Cluster
from autopar.planning.plan import Plan
from tests.helpers.dist_utils import run_gloo

SIZES = dict(layers=2, heads=4, attention="manual", batch=4, seq=16)


def llama():
    model, inputs = autopar.zoo.get("llama", **SIZES)
    return model.to(torch.float64), inputs


def worker(rank, world, doc, made):
    torch.set_num_threads(1)
    out = {}
    for rc in (False, "attention"):
        model, inputs = copy.deepcopy(made[0]), made[1]
        module = autopar.compile(model, inputs, plan=Plan.from_json(doc), recompute=rc)
        kept = [0]

        def pack(t):
            kept[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = module(*inputs)
        loss.backward()
        out[rc] = dict(loss=float(loss.detach()), kept=kept[0],
                       grads={n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
                              for n, p in module.named_parameters()},
                       recomputed=[m.block for m in module.program.module.modules()
                                   if type(m).__name__ == "Recomputed"])
    return out


@pytest.fixture(scope="module")
def runs():
    model, inputs = llama()
    doc = autopar.plan(model.float(), inputs, Cluster(devices=2), precision="fp32").baselines[
        "data_parallel"].to_json()
    ref_model, ref_inputs = llama()
    loss = ref_model(*ref_inputs)
    loss.backward()
    ref = dict(loss=float(loss.detach()), grads={n: p.grad for n, p in ref_model.named_parameters()})
    return run_gloo(worker, 2, doc, llama()), ref


@pytest.mark.dist
def test_attention_recompute_checkpoints_each_core_and_trains_like_one_device(runs):
    ranks, ref = runs
    for r in ranks:
        plain, att = r[False], r["attention"]
        assert plain["recomputed"] == [] and len(att["recomputed"]) == SIZES["layers"]
        assert all(b.endswith(f":attention{j}") for j, b in enumerate(att["recomputed"]))
        assert att["kept"] < plain["kept"]
        for got in (plain, att):
            assert got["loss"] == pytest.approx(ref["loss"], rel=1e-12)
            for n, g in ref["grads"].items():
                torch.testing.assert_close(got["grads"][n], g, rtol=1e-9, atol=1e-12, msg=lambda m, n=n: f"{n}: {m}")
