"""A Llama with context parallelism run as ring attention trains like one device.

The plan is ``test_context_parallel``'s (every node's sequence split over every mesh axis, HF's
explicit causal mask, grouped-query attention expanded before sdpa, float64) with its degrees
saying ring (``Degrees.ring``): each attention keeps its keys and values in their sequence
chunks and passes them around the context group (``codegen/ring_attention.py``) instead of
all-gathering them. On 2 and 4 gloo processes: the loss at every step, every gradient and every
parameter after 3 AdamW steps equal the single-device run's; both attentions ran as a ring at
every step, each with this rank's ``1/c`` of the keys (no gather), and none through the
all-gather path's ``Balance.call``.

The same for the hierarchical search's own layouts (``--pin`` tensor 1 x context 2 x data 2 on
4 threaded ranks, the zoo's Llama with ``is_causal`` grouped-query attention): its pinned plan
with the ring chosen trains like one device, every attention a ring over the context axis. And
inside a pipeline (pipeline 2 x context 2 on 4 gloo processes, 2 microbatches of the planner's
zero bubble): each stage's attention a ring over its own 2 ranks, the losses, the first gradients
and the trained parameters of every stage equal one device's.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

import autopar
from autopar.core.strategy import Degrees, Strategy
from autopar.planning.plan import Plan
from tests.codegen.test_context_parallel import SEQ, llama, sequence_plan
from tests.helpers.dist_utils import run_gloo, run_threaded
from tests.helpers.numerics import check_module, check_pipelined, reference_run

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow


def ring_plan(model, kwargs, world: int) -> Plan:
    """``sequence_plan`` with its degrees context ``world``, as a ring."""
    plan = sequence_plan(model, kwargs, world)
    strategy = plan.strategy or Strategy()
    ring = Degrees((1,), (1,), (1,), (world,), ring=True)
    return dataclasses.replace(plan, strategy=dataclasses.replace(strategy, degrees=ring))


@functools.lru_cache(maxsize=None)
def _case(world: int):
    model, kwargs = llama()
    return ring_plan(model, kwargs, world).to_json(), reference_run(model, (), kwargs=kwargs)


def _rank(rank, world, doc, ref):
    from autopar.codegen.causal_balance import Balance
    from autopar.codegen.ring_attention import Ring

    keys, gathered, ring, balance = [], [], Ring.call, Balance.call
    Ring.call = lambda self, sdpa, args, kw: (keys.append((self.parts, {**dict(zip(("query", "key"), args)), **kw}
                                                                          ["key"].shape[-2])),
                                              ring(self, sdpa, args, kw))[1]
    Balance.call = lambda self, *a: (gathered.append(self.parts), balance(self, *a))[1]  # this process only
    model, kwargs = llama()
    plan = Plan.from_json(doc)
    assert plan.strategy.degrees.ring
    module = autopar.compile(model, kwargs, plan=plan)
    check_module(rank, module, (), ref, kwargs=kwargs)
    assert len(keys) >= 2 * 3 and set(keys) == {(world, SEQ // world)}, keys  # this rank's chunk of the keys
    assert not gathered, gathered


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_ring_context_llama_trains_like_one_device(world):
    doc, ref = _case(world)
    run_gloo(_rank, world, doc, ref)


def _threaded(rank, world, plan, ref, model, inputs):
    """A threaded rank (classes are shared between threads: the calls are checked on the module):
    every attention a ``Ring`` over the context axis (which refuses keys not in this rank's chunk)."""
    import copy

    from autopar.codegen.ring_attention import Ring

    module = autopar.compile(copy.deepcopy(model), inputs, plan=plan)
    check_module(rank, module, inputs, ref)
    rings = _attentions(module._inner)
    assert len(rings) == 2 and all(isinstance(r, Ring) and r.parts == 2 for r in rings), rings


def _attentions(sharded) -> list:
    """The ``balance`` of every attention in a compiled module's programs (a ``Ring`` when it runs as one)."""
    from autopar.codegen.calls import NodeCall

    programs = [p[0] if isinstance(p, tuple) else p for p in sharded._programs.values()]
    return [m.call.balance for p in programs for m in p.module.modules()
            if isinstance(m, NodeCall) and m.call.node.op == "sdpa"]


def _pinned_ring(pin: str):
    """The zoo's small Llama (float64) on 4 CPU devices, its pinned hierarchical plan with the ring chosen."""
    import torch

    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("llama", batch=4, seq=16, width=32, heads=2, kv_heads=1, ffn=64, layers=2,
                                    vocab=64)
    model = model.double()
    cluster = autopar.Cluster.preset("cpu", devices=4)
    plan = autopar.plan(model, inputs, cluster, hierarchical=True, pin=pin, zero=0,
                        recompute=False).baselines["published"]
    degrees = dataclasses.replace(plan.strategy.degrees, ring=True)
    return model, inputs, dataclasses.replace(plan, strategy=dataclasses.replace(plan.strategy, degrees=degrees))


def test_the_hierarchical_plans_ring_trains_like_one_device():
    model, inputs, plan = _pinned_ring("tensor=1,pipeline=1,context=2,data=2")
    run_threaded(_threaded, 4, plan, reference_run(model, inputs), model, inputs)


def _ring_stage(rank, world, plan, ref, model, inputs):
    """A pipelined rank: trained against one device; its stage's attentions and their parts."""
    module = autopar.compile(model, inputs, plan=plan)
    names = check_pipelined(rank, module, inputs, ref)
    return names, [(type(b).__name__, getattr(b, "parts", None)) for b in _attentions(module._inner.stage_module)]


@pytest.mark.dist
def test_a_pipelined_plans_ring_trains_like_one_device():
    model, inputs, plan = _pinned_ring("tensor=1,pipeline=2,context=2,data=1,microbatch=2")
    assert len(plan.stages) == 2 and plan.microbatches == 2 and plan.schedule == "zero-bubble"
    ranks = run_gloo(_ring_stage, 4, plan, reference_run(model, inputs), model, inputs)
    held = [names for names, _ in ranks]
    assert held[0] == held[1] and held[2] == held[3] and not set(held[0]) & set(held[2])
    assert held[0] + held[2] == [n for n, _ in model.named_parameters()]  # every parameter, on one stage
    assert all(rings == [("Ring", 2)] for _, rings in ranks), ranks  # one attention a stage, a ring of 2
