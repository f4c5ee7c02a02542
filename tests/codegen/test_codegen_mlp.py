"""The sharded MLP against a single-device run: forward, every gradient, three AdamW steps.

Plans: data parallel, Megatron (column then row parallel), a forced reduction split (k cut, so
partial sums flow into the next node), and 2-d meshes that mix them. Threads on the threaded
process group keep this fast; ``test_codegen_gloo`` runs the same check on real processes.
"""

from __future__ import annotations

import pytest
import torch

import autopar
from tests.dist_utils import run_threaded
from tests.test_codegen_ir import linear_cfg, mlp_graph
from tests.test_codegen_numerics import check_rank, reference_run
from autopar.core.tables import Config

MLP = dict(batch=8, inputs=8, hidden=16, layers=2, classes=4)


def ew(*axes_b_f) -> Config:
    b, f = axes_b_f
    return Config((2 ** len(b), 2 ** len(f)), (tuple(b), tuple(f)))


def ce(b=()) -> Config:
    return Config((2 ** len(b), 1), (tuple(b), ()))


def plans(world: int) -> dict[str, dict[str, Config]]:
    """Named assignments for a mesh of ``world`` devices (1-d for 2, (2, 2) for 4)."""
    if world == 2:
        return {
            "data_parallel": {"layers_0": linear_cfg(b=(0,)), "relu": ew((0,), ()),
                              "layers_1": linear_cfg(b=(0,)), "relu_1": ew((0,), ()),
                              "head": linear_cfg(b=(0,)), "cross_entropy": ce((0,))},
            "megatron": {"layers_0": linear_cfg(n=(0,)), "relu": ew((), (0,)),
                         "layers_1": linear_cfg(k=(0,))},
            "reduction_split": {"layers_0": linear_cfg(k=(0,)), "relu": ew((), (0,)),
                                "layers_1": linear_cfg(k=(0,)), "head": linear_cfg(n=(0,))},
        }
    return {
        "data_parallel": {"layers_0": linear_cfg(b=(0, 1)), "relu": ew((0, 1), ()),
                          "layers_1": linear_cfg(b=(0, 1)), "relu_1": ew((0, 1), ()),
                          "head": linear_cfg(b=(0, 1)), "cross_entropy": ce((0, 1))},
        "dp_x_megatron": {"layers_0": linear_cfg(b=(0,), n=(1,)), "relu": ew((0,), (1,)),
                          "layers_1": linear_cfg(b=(0,), k=(1,)), "relu_1": ew((0,), ()),
                          "head": linear_cfg(b=(0,)), "cross_entropy": ce((0,))},
        "reduction_split": {"layers_0": linear_cfg(b=(0,), k=(1,)), "relu": ew((1,), (0,)),
                            "layers_1": linear_cfg(k=(0, 1)), "relu_1": ew((), (0, 1)),
                            "head": linear_cfg(k=(0, 1)), "cross_entropy": ce((1,))},
    }


@pytest.fixture(scope="module")
def mlp_case():
    model, inputs = autopar.zoo.get("mlp", **MLP)
    return model, inputs, mlp_graph(model, inputs), reference_run(model, inputs)


@pytest.mark.parametrize("world,plan", [(2, p) for p in plans(2)] + [(4, p) for p in plans(4)])
def test_mlp_plan_matches_single_device(mlp_case, world, plan):
    model, inputs, graph, ref = mlp_case
    mesh = (2,) if world == 2 else (2, 2)
    run_threaded(check_rank, world, model, inputs, graph, plans(world)[plan], mesh, ref)
