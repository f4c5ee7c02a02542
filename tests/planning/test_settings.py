"""The planner's options are grouped (``planning/settings.py``): every keyword of ``autopar.plan``
is either the call, the cluster and the cost model, or a field of exactly one group, and a plan
made through the groups is the plan made through the keywords."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from torch import nn

import autopar
from autopar.planning import planner
from autopar.planning.settings import SearchSettings, SpaceSettings, TrainingSettings

# what is not an option of the search: the model and its call, the cluster, the cost model
CALL = {"model", "example_inputs", "cluster", "example_kwargs", "devices", "cost_model", "memory_capacity",
        "graph", "model_name"}
GROUPS = (SearchSettings, TrainingSettings, SpaceSettings)


def test_every_option_of_plan_is_in_exactly_one_group():
    fields = [f.name for g in GROUPS for f in dataclasses.fields(g)]
    assert len(fields) == len(set(fields)), fields
    params = inspect.signature(autopar.plan).parameters
    assert set(params) == CALL | set(fields)
    for g in GROUPS:  # and with the same defaults as the signature
        for f in dataclasses.fields(g):
            assert params[f.name].default == f.default, (g.__name__, f.name)


@pytest.mark.parametrize("bad, words", [(dict(pipeline="yes"), "pipeline must be True, False or 'auto'"),
                                        (dict(follow=2), "follow must be True, False or 'auto'"),
                                        (dict(time_limit=0), "time_limit is the solver's limit")])
def test_a_bad_search_option_is_one_line_as_the_group_is_made(bad, words):
    with pytest.raises(ValueError, match=words):
        SearchSettings(**bad)
    with pytest.raises(ValueError, match=words):
        autopar.plan(nn.Linear(4, 4), (torch.randn(2, 4),), "2xA100", **bad)


def test_the_grouped_entry_plans_as_the_keywords_do():
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))
    x = torch.randn(8, 16)
    graph = autopar.trace(model, (x,))
    kw = dict(search="dp", time_limit=30.0, baselines=False, zero=0, recompute=False)
    want = autopar.plan(model, (x,), "2xA100", graph=graph, **kw)
    got = planner.plan_with(model, (x,), "2xA100", example_kwargs=None, devices=None, cost_model="analytic",
                            memory_capacity=None, graph=graph, model_name="",
                            searching=SearchSettings(search="dp", time_limit=30.0, baselines=False),
                            training=TrainingSettings(zero=0, recompute=False), scope=SpaceSettings())
    assert got.assignment == want.assignment and got.cost == want.cost
