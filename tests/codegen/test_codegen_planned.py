"""The whole pipeline: ``autopar.plan`` -> ``shard_module`` -> the single-device numerics.

The plans come from the planner itself (the searched best, and its data-parallel and Megatron
"expert" baselines, which are plans of the same tables), on the planner's own graph and mesh.
"""

from __future__ import annotations

import pytest

import autopar
from autopar.codegen.placements import node_layout
from tests.helpers.dist_utils import run_threaded
from tests.helpers.numerics import check_rank, reference_run


@pytest.fixture(scope="module")
def planned():
    model, inputs = autopar.zoo.get("gpt", layers=1, batch=4, seq=8, width=16, heads=2, vocab=32)
    plan = autopar.plan(model, inputs, autopar.Cluster(devices=4), pipeline=False)
    return model, inputs, plan, reference_run(model, inputs)


@pytest.mark.parametrize("which", ["best", "data_parallel", "expert"])
def test_planned_gpt_matches_single_device(planned, which):
    model, inputs, plan, ref = planned
    chosen = plan if which == "best" else plan.baselines[which]
    mesh = tuple(plan.mesh.shape)
    for node in plan.graph.nodes:  # every config of the plan has a layout codegen can build
        node_layout(node, chosen.assignment.get(node.name), mesh)
    run_threaded(check_rank, plan.devices, model, inputs, plan.graph, chosen.assignment, mesh, ref)
