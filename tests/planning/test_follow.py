"""The reduced space where ops without FLOPs or parameters follow their producer (planning/follow.py):
the reduced tables price every plan of that space as the full tables do, the DP on them finds
that space's optimum (brute force over the roots), and the plan says which space it searched."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn as nn

import autopar
from autopar.cost_models.tables import build_tables
from autopar.planning.follow import DETAIL, follow_producers
from autopar.search import dp


class Heads(nn.Module):
    """linear -> view into heads -> transpose -> scale -> transpose back -> reshape -> linear."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.a(x).view(b, s, 4, 4).transpose(1, 2)
        h = (h * 0.5).transpose(1, 2).reshape(b, s, 16)
        return self.b(h).sum()


@pytest.fixture(scope="module")
def small():
    model, x = Heads(), torch.randn(4, 8, 16)
    graph = autopar.trace(model, (x,))
    tables = build_tables(graph, autopar.Cluster(devices=2))
    return model, x, graph, tables


def test_reduced_tables_price_every_plan_of_the_space_as_the_full_tables(small):
    _, _, graph, tables = small
    red = follow_producers(graph, tables)
    assert red is not None
    followers = [i for i, p in enumerate(red.pick) if p is not None]
    assert followers and all(not graph.nodes[i].flops and not graph.nodes[i].params for i in followers)
    rng = np.random.default_rng(0)
    for _ in range(200):
        choice = [int(rng.integers(len(c))) for c in red.tables.configs]
        full = red.choice(choice)
        assert red.tables.total(choice) == pytest.approx(tables.total(full), rel=1e-12)
        assert red.tables.total_memory(choice) == pytest.approx(tables.total_memory(full), rel=1e-12)


def test_dp_on_the_reduced_tables_is_the_optimum_of_the_reduced_space(small):
    _, _, graph, tables = small
    red = follow_producers(graph, tables)
    roots = [i for i, p in enumerate(red.pick) if p is None]
    best = np.inf
    for combo in itertools.product(*(range(len(red.tables.configs[i])) for i in roots)):
        choice = [0] * len(red.tables.configs)
        for i, c in zip(roots, combo):
            choice[i] = c
        best = min(best, tables.total(red.choice(choice)))
    sol = dp(red.tables)
    assert sol.cost == pytest.approx(best, rel=1e-12)
    assert dp(tables).cost <= sol.cost * (1 + 1e-12)  # the full space can only be as good or better


def test_the_plan_says_which_space_it_searched(small):
    model, x, graph, _ = small
    full = autopar.plan(model, (x,), autopar.Cluster(devices=2), graph=graph, follow=False, baselines=False)
    auto = autopar.plan(model, (x,), autopar.Cluster(devices=2), graph=graph, baselines=False)
    red = autopar.plan(model, (x,), autopar.Cluster(devices=2), graph=graph, follow=True, baselines=False)
    assert DETAIL not in full.search.detail and auto.assignment == full.assignment  # small: full space
    assert red.search.status == "optimal" and DETAIL in red.search.detail
    assert DETAIL in red.search.describe()
    assert red.cost >= full.cost * (1 - 1e-12)
    with pytest.raises(ValueError, match="follow"):
        autopar.plan(model, (x,), autopar.Cluster(devices=2), graph=graph, follow="yes")


def test_a_pipelined_plan_says_its_stages_were_searched_in_the_reduced_space():
    import dataclasses

    model, inputs = autopar.zoo.get("gpt", layers=8, width=1024, heads=16, seq=512, batch=32, vocab=32768,
                                    device="meta")  # as in test_planner's pipeline test
    slow = dataclasses.replace(autopar.Cluster.preset("2x8xH100"), inter_bandwidth=2e8, name="slow-ib")
    plan = autopar.plan(model, inputs, slow, follow=True, pipeline=True, baselines=False, precision="fp32")
    assert plan.stages and plan.search.status == "heuristic"  # a pipeline wins across the slow link
    assert "stages searched over a space where ops without FLOPs" in plan.search.detail
    full = autopar.plan(model, inputs, slow, follow=False, pipeline=True, baselines=False, precision="fp32")
    assert "stages searched" not in full.search.detail
