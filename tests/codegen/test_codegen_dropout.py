"""Dropout in the sharded module: each rank draws the WHOLE tensor's mask from the same seed and
keeps its shard's part (``op_fixes.whole_dropout``), so on the CPU the masks are exactly those of
the single-device model (same seed, same draws in the same order), shards of one tensor get
different masks and replicas the same one. Real gloo processes: the threaded process group's ranks
would share one random generator."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autopar
from tests.helpers.dist_utils import run_gloo
from tests.helpers.plans import split_plan

SEED, STEPS = 123, 3


class Dropped(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x, labels):
        h = self.drop(F.relu(self.fc1(x)))
        return F.cross_entropy(F.dropout(self.fc2(h), 0.2, self.training), labels)


def _model():
    torch.manual_seed(0)
    return Dropped(), (torch.randn(8, 16), torch.randint(0, 4, (8,)))


def _train(module, inputs, steps):
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2, eps=1e-6)
    torch.manual_seed(SEED)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = module(*inputs)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def _rank(rank, world, plan, steps):
    model, inputs = _model()
    module = autopar.compile(model, inputs, plan=plan)
    losses = _train(module, inputs, steps)
    return losses, {n: p.full_tensor().detach().numpy() for n, p in module.named_parameters()}  # no shared memory across the pipe


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("which", ["data_parallel", "split_everything"])
def test_dropout_masks_are_the_single_device_ones(which, world):
    model, inputs = _model()
    best = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=world), pipeline=False)
    plan = best.baselines["data_parallel"] if which == "data_parallel" else split_plan(best)
    assert any(any(s > 1 for s in plan.assignment[n.name].splits) for n in best.graph.nodes if n.op == "dropout")
    single = copy.deepcopy(model)
    want = _train(single, inputs, STEPS)
    for losses, params in run_gloo(_rank, world, plan, STEPS):
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want), rtol=1e-5, atol=0)
        for n, p in single.named_parameters():
            torch.testing.assert_close(torch.from_numpy(params[n]), p.detach(), rtol=1e-4, atol=1e-6)


@pytest.mark.dist
def test_with_dropout_the_sharded_model_learns():
    model, inputs = _model()
    plan = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=2), pipeline=False)
    losses, _ = run_gloo(_rank, 2, plan.baselines["data_parallel"], 20)[0]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses
