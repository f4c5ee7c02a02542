"""Plain nodes inlined into the rank's program (``codegen.ops.inline_call``): the traced op as a
graph node instead of a ``NodeCall`` module, where the op needs none of ``LocalCall``'s repairs.
Against the program built with every node a ``NodeCall`` (the path the rest of the codegen tests
check against one device): the same loss and gradients, bit for bit, and the repairs kept."""

from __future__ import annotations

import copy

import pytest
import torch

import autopar
from autopar.planning.plan import Plan
from tests.helpers.dist_utils import run_gloo
from tests.helpers.training_plans import gpt, make_plans


def _kinds(module) -> dict[str, str]:
    """Program node name -> "inline" (a call of the op) or the module class it calls."""
    gm = module.program.module
    out = {}
    for n in gm.graph.nodes:
        if n.op == "call_module":
            out[n.name] = type(gm.get_submodule(n.target)).__name__
        elif n.op in ("call_function", "call_method"):
            out[n.name] = "inline"
    return out


def _step(module, inputs):
    loss = module.train_step(*inputs)
    return float(loss), {n: p.grad.full_tensor().clone() for n, p in module.named_parameters()}


def _both(rank, world, doc, built):
    from autopar.codegen import program

    model, inputs = copy.deepcopy(built)
    inlined = autopar.compile(copy.deepcopy(model), inputs, plan=Plan.from_json(doc))
    real = program.inline_call
    program.inline_call = lambda *a, **k: None  # every node a NodeCall, as before inlining
    try:
        calls = autopar.compile(copy.deepcopy(model), inputs, plan=Plan.from_json(doc))
    finally:
        program.inline_call = real
    return _kinds(inlined), _kinds(calls), _step(inlined, inputs), _step(calls, inputs)


@pytest.mark.parametrize("world, kind", [(2, "dp"), (4, "hybrid")])
def test_plain_nodes_run_inline_with_the_numbers_of_node_calls(world, kind):
    model, inputs = gpt()
    linears = [name.replace(".", "_") for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    for inl, calls, (loss_i, grads_i), (loss_c, grads_c) in run_gloo(_both, world, make_plans(world)[kind],
                                                                    (model, inputs)):
        assert loss_i == loss_c
        for name, g in grads_c.items():
            assert torch.equal(grads_i[name], g), name
        assert set(inl) == set(calls)  # the same program nodes, under the traced names
        assert all(calls[n] == "NodeCall" for n in linears if n in calls)  # the reference: all NodeCalls
        assert sum(v == "inline" for v in inl.values()) > sum(v == "inline" for v in calls.values())
        if kind == "dp":  # every linear of data parallelism is a plain call on the local batch
            assert all(inl.get(n) == "inline" for n in linears), {n: inl.get(n) for n in linears}
        # the loss's mean over a split batch is weighted by its count (codegen/counted.py): the
        # local mean a plain call, the count a module of its own, its scale a function after it
        assert inl["cross_entropy"] == "inline" and "CountStart" in inl.values() and "counted_scale" in inl
