"""Gradient accumulation in codegen: a plan that accumulates k microbatches trains like one device
on the whole batch (float64: the losses, the gradients and the parameters after 3 AdamW steps), on
2 gloo processes, and its gradient buckets are reduced once per step, after the last microbatch."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.tensor import DTensor

import autopar
from autopar.core.cluster import Cluster
from autopar.core.strategy import TrainingOptions
from autopar.planning.options import strategy_of
from autopar.planning.plan import Plan
from tests.helpers.dist_utils import run_gloo

SIZES = dict(batch=8, seq=8, width=16, heads=2, layers=2, vocab=32)
LR, STEPS, WORLD = 1e-2, 3, 2


def gpt():
    model, inputs = autopar.zoo.get("gpt", **SIZES)
    return model.to(torch.float64), inputs


def worker(rank, world, doc, made, counts):
    torch.set_num_threads(1)
    out = {}
    for k in counts:
        model, inputs = copy.deepcopy(made[0]), made[1]
        plan = Plan.from_json(doc)
        plan.strategy = strategy_of(autopar.trace(model, inputs), TrainingOptions(accumulate=k), plan.assignment)
        module = autopar.compile(model, inputs, plan=plan)
        reducer = module.reducer
        launched = []
        launch = reducer._launch
        reducer._launch = lambda b: (launched.append(b), launch(b))[1]
        opt = module.optimizer(torch.optim.AdamW, lr=LR)
        losses, grads = [], None
        for _ in range(STEPS):
            opt.zero_grad()
            losses.append(float(module.train_step(*inputs)))
            if grads is None:
                grads = {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
                         for n, p in module.named_parameters()}
            opt.step()
        params = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
                  for n, p in module.named_parameters()}
        out[k] = dict(losses=losses, grads=grads, params=params, launched=len(launched),
                      buckets=len(reducer.buckets))
    return out


def one_device() -> dict:
    model, inputs = gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, grads = [], None
    for _ in range(STEPS):
        opt.zero_grad()
        loss = model(*inputs)
        loss.backward()
        losses.append(float(loss.detach()))
        if grads is None:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
    return dict(losses=losses, grads=grads, params={n: p.detach().clone() for n, p in model.named_parameters()})


@pytest.fixture(scope="module")
def runs():
    model, inputs = gpt()
    doc = autopar.plan(model.float(), inputs, Cluster(devices=WORLD), precision="fp32").baselines[
        "data_parallel"].to_json()
    return run_gloo(worker, WORLD, doc, gpt(), (2, 4)), one_device()


@pytest.mark.dist
@pytest.mark.parametrize("k", [2, 4])
def test_accumulation_trains_like_one_device(runs, k):
    ranks, ref = runs
    for got in (r[k] for r in ranks):
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref["losses"]), rtol=1e-10, atol=1e-12)
        for what in ("grads", "params"):
            assert set(got[what]) == set(ref[what])
            for n in ref[what]:
                torch.testing.assert_close(got[what][n], ref[what][n], rtol=1e-9, atol=1e-11,
                                           msg=lambda m, n=n: f"k={k} {what} {n}: {m}")


@pytest.mark.dist
@pytest.mark.parametrize("k", [2, 4])
def test_accumulation_reduces_each_bucket_once_per_step(runs, k):
    ranks, _ = runs
    for got in (r[k] for r in ranks):
        assert got["launched"] == STEPS * got["buckets"], got


def test_accumulation_refuses_a_batch_it_does_not_divide():
    from autopar.codegen.accumulate import microbatches

    with pytest.raises(ValueError, match="does not split into 3 equal microbatches"):
        microbatches((torch.zeros(8, 2),), {}, 3)
    parts = microbatches((torch.arange(8.0).view(4, 2), 5), {"y": torch.arange(4)}, 2)
    assert [p[0][0].tolist() for p in parts] == [[[0.0, 1.0], [2.0, 3.0]], [[4.0, 5.0], [6.0, 7.0]]]
    assert [p[1]["y"].tolist() for p in parts] == [[0, 1], [2, 3]]
