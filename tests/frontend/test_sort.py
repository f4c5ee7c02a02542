"""sort and argsort: they trace to a node whose sorted axis stays whole (both front ends), a
mixture of experts' dispatch built on them (the zoo's DeepSeek-shaped decoder) has no replicated
sort, and a model that sorts along one axis trains like one device with the other axes split."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import autopar
from tests.helpers.dist_utils import run_threaded
from tests.helpers.numerics import check_module, reference_run
from tests.helpers.plans import split_plan


class Ranked(nn.Module):
    """Scores sorted along the last axis, weighted by rank, and gathered back by an argsort."""

    def __init__(self, width: int = 8, scores: int = 6):
        super().__init__()
        self.score, self.rank = nn.Linear(width, scores), nn.Parameter(torch.linspace(1.0, 2.0, scores))

    def forward(self, x):
        s = self.score(x)
        values, _ = torch.sort(s, dim=-1, descending=True)
        order = torch.argsort(s, dim=-1, stable=True)
        return (values * self.rank).pow(2).mean() + torch.gather(s, -1, order).exp().mean()


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_sort_and_argsort_trace_to_nodes_with_the_sorted_axis_whole(frontend):
    graph = autopar.trace(Ranked(), (torch.randn(4, 5, 8),), frontend=frontend)
    nodes = [n for n in graph.nodes if n.target.endswith(("sort", "sort.default", "sort.stable", "argsort.stable"))]
    assert [n.op for n in nodes] == ["sort", "sort"] and not any(n.unsupported for n in nodes)
    for n in nodes:
        assert [(d.size, d.splittable) for d in n.dims] == [(4, True), (5, True), (6, False)]
    assert [len(n.outputs) for n in nodes] == [2, 1]


def test_the_moe_decoders_dispatch_sorts_without_replicating():
    model, inputs = autopar.zoo.get("moe_decoder", batch=2, seq=8, width=32, experts=4, top_k=2, ffn=48, layers=1,
                                    heads=2, kv_heads=2, vocab=64)
    graph = autopar.trace(model, inputs)
    sorts = [n for n in graph.nodes if "argsort" in n.target]
    assert sorts and all(n.op == "sort" for n in sorts)
    assert not [n.name for n in graph.nodes if n.op == "opaque" and "sort" in n.target]


def _check(rank, world, model, inputs, plan, ref):
    check_module(rank, autopar.compile(model, inputs, plan=plan), inputs, ref)


def test_a_model_that_sorts_trains_like_one_device_with_its_rows_split():
    torch.manual_seed(0)
    model, inputs = Ranked().double(), (torch.randn(4, 6, 8, dtype=torch.float64),)
    best = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=2), pipeline=False)
    plan = split_plan(best)
    sorts = [n for n in best.graph.nodes if n.op == "sort"]
    assert len(sorts) == 2 and all(max(plan.assignment[n.name].splits) == 2 for n in sorts)
    run_threaded(_check, 2, model, inputs, plan, reference_run(model, inputs))
