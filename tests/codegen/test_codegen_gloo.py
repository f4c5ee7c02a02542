"""On real gloo processes: numerics of MLP plans, and the collectives each plan runs.

One launch per process count serves every test here (start-up is the slow part on 2 cores).
The collectives a sharded module runs are exactly those its plan implies (CommDebugMode).

These counts are what a plan's predicted collective list is compared with: one all-reduce of the
loss in a data-parallel forward and one per parameter in its backward; Megatron's one all-reduce
of the row-parallel partial sums, and in backward only the row-parallel bias (its input x needs
no gradient); a reduction split reduce-scatters into the next node's shard. On a (2, 2) mesh a
redistribution over both axes is ONE collective (flattened mesh), as the cost model prices it.
"""

from __future__ import annotations

import pytest

import autopar
from tests.helpers.collective_counts import measure
from autopar.codegen.module import shard_module
from tests.helpers.dist_utils import run_gloo
from tests.helpers.mlp import linear_cfg, mlp_graph
from tests.helpers.mlp import MLP, ew, plans
from tests.helpers.numerics import check_rank, reference_run


def gloo_rank(rank, world, model, inputs, graph, assignments, mesh_shape, ref, checked):
    """A numerics check of plan ``checked``, then forward and backward collective counts."""
    check_rank(rank, world, model, inputs, graph, assignments[checked], mesh_shape, ref)
    out = {}
    for name, assignment in assignments.items():
        found = measure(shard_module(model, graph, assignment, mesh_shape), *inputs)
        out[name] = (found.forward, found.backward)
    return out


def batch_split_but_loss():
    plan = {n: linear_cfg(b=(0,)) for n in ("layers_0", "layers_1", "head")}
    plan.update(relu=ew((0,), ()), relu_1=ew((0,), ()))
    return plan


@pytest.fixture(scope="module")
def measured():
    """One gloo launch for every plan: CommDebugMode's module tracking is not thread-safe, so
    the threaded process group cannot be used here, and process start-up is the slow part."""
    model, inputs = autopar.zoo.get("mlp", **MLP)
    graph = mlp_graph(model, inputs)
    assignments = {**plans(2), "batch_split_but_loss": batch_split_but_loss()}
    per_rank = run_gloo(gloo_rank, 2, model, inputs, graph, assignments, (2,),
                        reference_run(model, inputs), "megatron")
    assert per_rank[0] == per_rank[1]
    return per_rank[0]


@pytest.fixture(scope="module")
def measured4():
    """Four processes on a (2, 2) mesh: data parallel over both axes, and DP x Megatron."""
    model, inputs = autopar.zoo.get("mlp", **MLP)
    graph = mlp_graph(model, inputs)
    assignments = {k: v for k, v in plans(4).items() if k in ("data_parallel", "dp_x_megatron")}
    per_rank = run_gloo(gloo_rank, 4, model, inputs, graph, assignments, (2, 2),
                        reference_run(model, inputs), "dp_x_megatron")
    assert all(r == per_rank[0] for r in per_rank)
    return per_rank[0]


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("plan,forward,backward", [
    # the loss (Partial, Partial): the count of its counted targets (``codegen/counted.py``)
    # and the loss, one all-reduce each over the flat group; the six gradients: one bucket (a few
    # KiB) over both axes, the reducer's c10d all-reduce (counted as all_reduce)
    ("data_parallel", {"all_reduce": 2}, {"all_reduce": 1}),
    # forward: row-parallel sums over axis 1, the loss's count and the loss over axis 0;
    # backward: the five weights and biases replicated on axis 0 in one bucket, layers_1's
    # additive bias (partial over both axes) in another
    ("dp_x_megatron", {"all_reduce": 3}, {"all_reduce": 2}),
])
def test_collectives_on_a_2x2_mesh(measured4, plan, forward, backward):
    fwd, bwd = measured4[plan]
    assert fwd == forward
    assert bwd == backward


@pytest.mark.dist
def test_megatron_mlp_matches_single_device_on_gloo(measured):
    assert set(measured) >= {"megatron"}  # gloo_rank's check_rank raised otherwise


@pytest.mark.dist
@pytest.mark.parametrize("plan,forward,backward", [
    ("data_parallel", {"all_reduce": 2}, {"all_reduce": 1}),  # forward: the loss's count, the loss
    # backward: the row-parallel layer's bias, added once, is the only partial gradient
    ("megatron", {"all_reduce": 1}, {"all_reduce": 1}),
    # k cut in layers_0/1, n in head: reduce-scatter into relu's shard, all-reduce into relu_1,
    # all-gather of the logits for the loss; backward: all-gather for the reduce-scatter, the
    # head's input gradient, and the two biases added once (one bucket)
    ("reduction_split", {"reduce_scatter_tensor": 1, "all_reduce": 1, "all_gather_into_tensor": 1},
     {"all_gather_into_tensor": 1, "all_reduce": 2}),
])
def test_collectives_of_a_plan(measured, plan, forward, backward):
    fwd, bwd = measured[plan]
    assert fwd == forward
    assert bwd == backward


@pytest.mark.dist
def test_consistent_layouts_need_no_communication(measured):
    """Batch-split everywhere but the loss: nothing moves until the loss gathers the batch."""
    fwd, _ = measured["batch_split_but_loss"]
    assert fwd == {"all_gather_into_tensor": 1}
