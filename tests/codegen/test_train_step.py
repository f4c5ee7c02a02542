"""``module.train_step``: the loss's all-reduce deferred beside the backward, outputs other than
the loss not made whole; the same loss and gradients as ``loss = module(x); loss.backward()``
and as one device (float64). On gloo processes: torch's CommDebugMode, which counts the
collectives, is not safe across the threads of a threaded process group."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from tests.helpers.collective_counts import counts
from torch import nn
from torch.distributed.tensor.debug import CommDebugMode

import autopar
from autopar.planning.plan import Plan
from tests.helpers.dist_utils import run_gloo
from tests.helpers.training_plans import gpt, make_plans


def _grads(module) -> dict[str, torch.Tensor]:
    return {n: p.grad.full_tensor().clone() for n, p in module.named_parameters() if p.grad is not None}


def _both_ways(rank, world, doc, built):
    model, inputs = copy.deepcopy(built)
    stepped = autopar.compile(copy.deepcopy(model), inputs, plan=Plan.from_json(doc))
    plain = autopar.compile(model, inputs, plan=Plan.from_json(doc))
    with CommDebugMode() as step:
        loss = stepped.train_step(*inputs)
    with CommDebugMode() as fwd:
        whole = plain(*inputs)
    whole.backward()
    with stepped.program.outputs_deferred():
        term = stepped(*inputs).detach()  # this rank's term of the loss (a partial sum)
    return float(loss), float(whole), float(term), _grads(stepped), _grads(plain), counts(step), counts(fwd)


@pytest.mark.parametrize("world, kind", [(2, "dp"), (4, "hybrid")])
def test_train_step_defers_the_loss_and_equals_forward_backward(world, kind):
    model, inputs = gpt()
    ref = copy.deepcopy(model)
    ref(*inputs).backward()
    want = {n: p.grad for n, p in ref.named_parameters()}
    results = run_gloo(_both_ways, world, make_plans(world)[kind], (model, inputs))
    expected = float(ref(*inputs))
    terms = [r[2] for r in results]
    # the loss is a sum over the batch axis (2 ranks, mesh axis 0); "hybrid" replicates it over axis 1
    assert sum(terms[::world // 2]) == pytest.approx(expected, rel=1e-12)
    assert any(t != pytest.approx(expected, rel=1e-6) for t in terms)
    for loss, whole, _, grads, plain_grads, step, fwd in results:
        assert loss == pytest.approx(expected, rel=1e-12) and whole == pytest.approx(expected, rel=1e-12)
        assert grads.keys() == plain_grads.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(grads[name], plain_grads[name], rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(grads[name], want[name], rtol=1e-9, atol=1e-12)
        assert step.get("all_reduce", 0) >= 1  # the loss, now summed after the forward


class WithLogits(nn.Module):
    """A model returning the loss and its logits (as Hugging Face models do)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 4)

    def forward(self, x, y):
        logits = self.fc2(torch.relu(self.fc1(x)))
        return {"loss": F.cross_entropy(logits, y), "logits": logits}


def _logits_rank(rank, world, doc, built):
    model, inputs = copy.deepcopy(built)
    module = autopar.compile(model, inputs, plan=Plan.from_json(doc))
    with CommDebugMode() as step:
        loss = module.train_step(*inputs)
    with CommDebugMode() as fwd:
        out = module(*inputs)
    return float(loss), out["logits"].detach(), counts(step), counts(fwd)


def test_train_step_does_not_gather_outputs_it_drops():
    torch.manual_seed(0)
    model, inputs = WithLogits().double(), (torch.randn(8, 8, dtype=torch.float64), torch.randint(0, 4, (8,)))
    plan = autopar.plan(model, inputs, autopar.Cluster(devices=2), precision="fp32").baselines["data_parallel"]
    expected = model(*inputs)
    for loss, logits, step, fwd in run_gloo(_logits_rank, 2, plan.to_json(), (model, inputs)):
        assert loss == pytest.approx(float(expected["loss"]), rel=1e-12)
        torch.testing.assert_close(logits, expected["logits"].detach())  # forward still makes them whole
        assert fwd.get("all_gather_into_tensor", 0) >= 1  # the batch-sharded logits gathered
        assert step.get("all_gather_into_tensor", 0) == 0  # ... but not by the step, which drops them
