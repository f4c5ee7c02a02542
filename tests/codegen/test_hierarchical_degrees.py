"""A hierarchical plan's context and expert degrees are emitted, not only priced.

The hierarchical search prices a context degree (each sequence split over ``c`` ranks) and an
expert degree (the routed experts split over ``ep`` of the data-parallel devices); its plan's
per-node layouts must run what was priced. Here the plans are the ones ``--pin`` prices (the
``published`` baseline) on 4 threaded ranks: their layouts are checked against the degrees
(attention split by query rows over the context axis with the keys whole, the loss's flattened
rows over data x context, the experts over the expert axis with their tokens over the rest of the
data axes), and the compiled module trains like one device (float64: the loss at every step,
every gradient and every parameter after 3 AdamW steps). A pipelined plan with data parallelism
inside its stages (pipeline 2 x data 2 on 4 gloo processes, 2 microbatches of the zero-bubble
schedule the planner picks, whose backward runs in an input and a weight half) trains every
parameter of both stages like one device.
"""

from __future__ import annotations

import pytest
import torch

import autopar
from tests.helpers.dist_utils import run_gloo, run_threaded
from tests.helpers.numerics import check_module, check_pipelined, reference_run


def _pinned(model, inputs, world: int, pin: str):
    cluster = autopar.Cluster.preset("cpu", devices=world)
    plan = autopar.plan(model, inputs, cluster, hierarchical=True, pin=pin, zero=0, recompute=False)
    return plan.baselines["published"]


def _splits(plan, node) -> dict:
    c = plan.assignment[node.name]
    return {d.name: (k, tuple(ax)) for d, k, ax in zip(node.dims, c.splits, c.mesh_axes) if k > 1}


def _check(rank, world, model, inputs, plan, ref):
    check_module(rank, autopar.compile(model, inputs, plan=plan), inputs, ref)


def test_a_context_degree_splits_the_sequence_and_trains_like_one_device():
    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("llama", batch=4, seq=16, width=32, heads=2, kv_heads=1, ffn=64, layers=2,
                                    vocab=64)
    model = model.double()
    plan = _pinned(model, inputs, 4, "tensor=1,pipeline=1,context=2,data=2")
    assert plan.strategy.degrees.c == 2 and tuple(plan.mesh.shape) == (2, 2)
    attention = [n for n in plan.graph.nodes if n.op == "sdpa"]
    assert len(attention) == 2
    for n in attention:  # data axis 0 cuts the batch, context axis 1 the query rows; keys whole
        assert _splits(plan, n) == {"b": (2, (0,)), "l": (2, (1,))}, _splits(plan, n)
    loss = next(n for n in plan.graph.nodes if n.op == "cross_entropy")
    assert [k for k, _ in _splits(plan, loss).values()] == [4]  # its flattened rows over data x context
    run_threaded(_check, 4, model, inputs, plan, reference_run(model, inputs))


@pytest.mark.parametrize("world,pin,experts_axes,token_axes",
                         [(2, "tensor=1,pipeline=1,expert=2,data=2", (0,), ()),
                          (4, "tensor=1,pipeline=1,expert=2,data=4", (1,), (0,))],
                         ids=["2-experts", "4-experts-and-tokens"])
def test_an_expert_degree_splits_the_experts_and_trains_like_one_device(world, pin, experts_axes, token_axes):
    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("moe", batch=4, seq=6, width=16, hidden=24, experts=4, layers=2)
    model = model.double()
    inputs = (inputs[0].double(), inputs[1])
    plan = _pinned(model, inputs, world, pin)
    assert plan.strategy.degrees.ep == 2
    experts = [n for n in plan.graph.nodes if n.op == "moe_experts"]
    assert len(experts) == 2
    for n in experts:
        want = {"experts": (2, experts_axes)} | ({"tokens": (2, token_axes)} if token_axes else {})
        assert _splits(plan, n) == want, _splits(plan, n)
    first = plan.graph.nodes[0]  # everything else is data-parallel over every device
    assert [k for k, _ in _splits(plan, first).values()] == [world], _splits(plan, first)
    run_threaded(_check, world, model, inputs, plan, reference_run(model, inputs))


@pytest.mark.parametrize("listed", [False, True], ids=["stacked", "listed"])
def test_expert_parallelism_beside_tensor_parallelism_trains_like_one_device(listed):
    """Expert, tensor and data parallelism in one plan (4 ranks, ``tensor=2,expert=2,data=2``):
    the router and the head Megatron-split over the tensor axis, the experts cut over the mesh,
    stacked or as a list of modules; the module trains like one device."""
    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("moe", batch=4, seq=6, width=16, hidden=24, experts=4, layers=2, listed=listed)
    model = model.double()
    inputs = (inputs[0].double(), inputs[1])
    plan = _pinned(model, inputs, 4, "tensor=2,pipeline=1,expert=2,data=2")
    assert (plan.strategy.degrees.ep, plan.strategy.degrees.t) == (2, 2)
    linears = [n for n in plan.graph.nodes if n.op == "linear"]
    assert all(set(_splits(plan, n)) & {"k", "n"} for n in linears), [_splits(plan, n) for n in linears]
    experts = [n for n in plan.graph.nodes if n.op == "moe_experts"]
    assert len(experts) == 2 and all(_splits(plan, n)["experts"][0] >= 2 for n in experts)
    run_threaded(_check, 4, model, inputs, plan, reference_run(model, inputs))


def _pipelined(rank, world, model, inputs, plan, ref):
    return check_pipelined(rank, autopar.compile(model, inputs, plan=plan), inputs, ref)


@pytest.mark.slow
@pytest.mark.dist
def test_data_parallel_stages_of_a_zero_bubble_pipeline_train_like_one_device():
    """Each stage's microbatch split over its 2 ranks; the weight half of every stage's backward
    (the last stage's too, whose program reads its parameters' local tensors) reaches every
    parameter, summed over the stage's data-parallel ranks."""
    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("gpt", batch=4, seq=8, width=16, heads=2, layers=2, vocab=32)
    model = model.double()
    plan = _pinned(model, inputs, 4, "tensor=1,pipeline=2,data=2,microbatch=1")
    assert [s.devices for s in plan.stages] == [2, 2] and plan.microbatches == 2
    assert plan.schedule == "zero-bubble" and tuple(plan.mesh.shape) == (2, 2)
    held = run_gloo(_pipelined, 4, model, inputs, plan, reference_run(model, inputs))
    assert held[0] == held[1] and held[2] == held[3] and not set(held[0]) & set(held[2])
    assert held[0] + held[2] == [n for n, _ in model.named_parameters()]  # every parameter, on one stage
