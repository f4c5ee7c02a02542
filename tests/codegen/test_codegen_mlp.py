"""The sharded MLP against a single-device run: forward, every gradient, three AdamW steps.

Plans: data parallel, Megatron (column then row parallel), a forced reduction split (k cut, so
partial sums flow into the next node), and 2-d meshes that mix them. Threads on the threaded
process group keep this fast; ``test_codegen_gloo`` runs the same check on real processes.
"""

from __future__ import annotations

import pytest

import autopar
from tests.helpers.dist_utils import run_threaded
from tests.helpers.mlp import MLP, mlp_graph, plans
from tests.helpers.numerics import check_rank, reference_run

@pytest.fixture(scope="module")
def mlp_case():
    model, inputs = autopar.zoo.get("mlp", **MLP)
    return model, inputs, mlp_graph(model, inputs), reference_run(model, inputs)


@pytest.mark.parametrize("world,plan", [(2, p) for p in plans(2)] + [(4, p) for p in plans(4)])
def test_mlp_plan_matches_single_device(mlp_case, world, plan):
    model, inputs, graph, ref = mlp_case
    mesh = (2,) if world == 2 else (2, 2)
    run_threaded(check_rank, world, model, inputs, graph, plans(world)[plan], mesh, ref)
