"""A tensor group whose exact DP refuses its tables (past its memory budget) does not end the
hierarchical search: its candidates keep the bounds they have, unpriced, the search line says
so, and the bound stays below the optimum of the space."""

from __future__ import annotations

import dataclasses

import torch

import autopar
from autopar.core.fingerprint import fingerprint
from autopar.core.margin import usable_memory
from autopar.planning import hierarchical as H
from autopar.search.common import SearchTooLargeError
from autopar.search.dp import dp
from tests.helpers.layouts import CLUSTER, SCHEDULES, ZEROS, Residual
from tests.planning.test_space_bound import brute_force


def _refusing(tables, graph=None):
    """The exact DP, refusing every group of more than one layout per node (as the budget refuses
    a large model's group spanning nodes)."""
    if any(len(k) > 1 for k in tables.configs):
        raise SearchTooLargeError("the exact DP needs 9.99 GiB of tables, over its budget of 1.00 GiB")
    return dp(tables)


def test_a_group_past_the_dps_budget_keeps_its_bound_and_the_search_goes_on():
    g = autopar.trace(Residual().to("meta"), (torch.empty(2, 16, device="meta"),))
    capacity = usable_memory(CLUSTER.memory_capacity)
    exact = H.Search(g, CLUSTER, "bf16", "adam", "train", capacity, lambda t, g=None: dp(t))
    optimum = min(p.cost for p in brute_force(exact) if p.fits)
    search = H.Search(g, CLUSTER, "bf16", "adam", "train", capacity, _refusing)
    best, _, _, _ = search.best(None, ZEROS, (False,), schedules=SCHEDULES)
    assert best is not None and best.candidate.degrees.t == 1
    assert search.refused and all(c.degrees.t > 1 for c in search.refused)
    assert search.space_bound <= optimum * (1 + 1e-9) <= best.cost * (1 + 1e-9)
    assert any(c in search.bounds for c in search.refused)  # refused, not dropped: their bounds still count


def test_the_search_line_says_which_candidates_went_unpriced():
    g = autopar.trace(Residual().to("meta"), (torch.empty(2, 16, device="meta"),))
    common = dict(model_name="residual", fingerprint=fingerprint(g), cluster=dataclasses.asdict(CLUSTER),
                  cost_model="analytic", mode="train")
    plan = H.plan_hierarchical(g, CLUSTER, common, solve=_refusing, with_baselines=False)
    assert plan.strategy.degrees.t == 1
    assert "unpriced, their group's DP past its table budget" in plan.search.detail
