"""histc: it traces to a node whose input axes are reductions (both front ends; none splits when
the range is the data's own), and a router's load-balancing loss built on it (Switch's: the
fraction of tokens each expert receives times its mean gate) trains like one device with the
tokens split, the shards' counts summed."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import autopar
from tests.helpers.dist_utils import run_threaded
from tests.helpers.numerics import check_module, reference_run
from tests.helpers.plans import split_plan


class Balanced(nn.Module):
    """A top-1 router's output and its load-balancing loss (counts by ``torch.histc``)."""

    def __init__(self, width: int = 8, experts: int = 4, ranged: bool = True):
        super().__init__()
        self.experts, self.ranged = experts, ranged
        self.gate, self.out = nn.Linear(width, experts), nn.Linear(width, width)

    def forward(self, x):
        probs = self.gate(x).softmax(-1)
        top, idx = torch.topk(probs, 1, dim=-1)
        e = self.experts
        counts = torch.histc(idx.to(x.dtype), bins=e, min=0, max=e - 1) if self.ranged else \
            torch.histc(idx.to(x.dtype), bins=e)
        share = counts / counts.sum()
        aux = (share * probs.mean(dim=(0, 1))).sum() * e
        return (self.out(x) * top).pow(2).mean() + aux


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_histc_traces_to_a_node_whose_input_axes_are_reductions(frontend):
    graph = autopar.trace(Balanced(), (torch.randn(4, 5, 8),), frontend=frontend)
    (node,) = [n for n in graph.nodes if "histc" in n.target]
    assert node.op == "histc" and not node.unsupported
    assert [(d.size, d.reduction, d.splittable) for d in node.dims] == [
        (4, True, True), (5, True, True), (1, True, True), (4, False, False)]
    assert node.outputs[0].shape == (4,)
    whole = autopar.trace(Balanced(ranged=False), (torch.randn(4, 5, 8),), frontend=frontend)
    (node,) = [n for n in whole.nodes if "histc" in n.target]
    assert not any(d.splittable for d in node.dims)  # the data's own range: a shard's would differ


def _check(rank, world, model, inputs, plan, ref):
    check_module(rank, autopar.compile(model, inputs, plan=plan), inputs, ref)


def test_a_load_balancing_loss_trains_like_one_device_with_the_tokens_split():
    torch.manual_seed(0)
    model, inputs = Balanced().double(), (torch.randn(4, 6, 8, dtype=torch.float64),)
    best = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=2), pipeline=False)
    plan = split_plan(best)
    (histc,) = [n for n in best.graph.nodes if n.op == "histc"]
    assert max(plan.assignment[histc.name].splits) == 2  # the tokens are split where histc counts them
    run_threaded(_check, 2, model, inputs, plan, reference_run(model, inputs))
