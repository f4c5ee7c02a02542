"""The zoo's mixture of experts (torch.fx: its experts are a leaf module, one ``moe_experts``
node) trains like one device with its experts split over 2 and 4 ranks, alone or beside a
split of the tokens (expert parallelism inside data-parallel groups)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import autopar
from autopar.core.tables import Config
from tests.helpers.dist_utils import run_threaded
from tests.helpers.numerics import check_module, reference_run


def _plan(model, inputs, world, experts_axes, token_axes):
    best = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=world), pipeline=False)
    assert best.graph.frontend == "fx"
    dp = best.baselines["data_parallel"]
    shape = tuple(dp.mesh.shape)
    assignment = dict(dp.assignment)
    nodes = [n for n in dp.graph.nodes if n.op == "moe_experts"]
    assert [n.module for n in nodes] == ["blocks.0.experts", "blocks.1.experts"]
    for n in nodes:
        axes = {"experts": experts_axes, "tokens": token_axes}
        assignment[n.name] = Config(tuple(math.prod(shape[a] for a in axes.get(d.name, ())) for d in n.dims),
                                    tuple(axes.get(d.name, ()) for d in n.dims))
    return dataclasses.replace(dp, assignment=assignment, baselines={})


def _check(rank, world, model, inputs, plan, ref):
    check_module(rank, autopar.compile(model, inputs, plan=plan), inputs, ref)


@pytest.mark.parametrize("world,experts_axes,token_axes", [(2, (0,), ()), (4, (0, 1), ()), (4, (1,), (0,))],
                         ids=["2-experts", "4-experts", "4-experts-and-tokens"])
def test_zoo_moe_with_its_experts_split_trains_like_one_device(world, experts_axes, token_axes):
    model, inputs = autopar.zoo.get("moe", batch=4, seq=6, width=16, hidden=24, experts=4, layers=2)
    model = model.double()
    inputs = (inputs[0].double(), inputs[1])
    plan = _plan(model, inputs, world, experts_axes, token_axes)
    run_threaded(_check, world, model, inputs, plan, reference_run(model, inputs))
