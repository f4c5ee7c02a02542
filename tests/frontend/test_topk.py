"""topk, a family added as one rule module and one registry line: it traces to a node whose
chosen axis stays whole (both front ends), and a router built on it trains like one device when
its tokens are split."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import autopar
from tests.helpers.dist_utils import run_threaded
from tests.helpers.numerics import check_module, reference_run
from tests.helpers.plans import split_plan


class Router(nn.Module):
    """Each token's two best experts by gate score (a mixture of experts' router, without the experts)."""

    def __init__(self, width: int = 8, experts: int = 6):
        super().__init__()
        self.gate, self.out = nn.Linear(width, experts), nn.Linear(width, width)

    def forward(self, x):
        scores = self.gate(x).softmax(-1)
        top, idx = torch.topk(scores, 2, dim=-1)
        return (self.out(x) * top.sum(-1, keepdim=True)).pow(2).mean() + torch.gather(scores, -1, idx).mean()


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_topk_traces_to_its_own_node_with_the_chosen_axis_whole(frontend):
    graph = autopar.trace(Router(), (torch.randn(4, 5, 8),), frontend=frontend)
    (node,) = [n for n in graph.nodes if n.target.endswith("topk")]
    assert node.op == "topk" and not node.unsupported
    assert [(d.size, d.splittable) for d in node.dims] == [(4, True), (5, True), (6, False)]
    assert [s.shape for s in node.outputs] == [(4, 5, 2), (4, 5, 2)]
    assert node.attrs == {"k": 2, "axis": 2, "largest": True}


def _check(rank, world, model, inputs, plan, ref):
    check_module(rank, autopar.compile(model, inputs, plan=plan), inputs, ref)


def test_a_router_with_its_tokens_split_trains_like_one_device():
    torch.manual_seed(0)
    model, inputs = Router().double(), (torch.randn(4, 6, 8, dtype=torch.float64),)
    best = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=2), pipeline=False)
    plan = split_plan(best)
    (topk,) = [n for n in best.graph.nodes if n.op == "topk"]
    assert max(plan.assignment[topk.name].splits) == 2  # the tokens are split where topk runs
    run_threaded(_check, 2, model, inputs, plan, reference_run(model, inputs))
