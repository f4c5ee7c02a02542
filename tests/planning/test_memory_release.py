"""Planning returns its memory by reference counting: a model planned and dropped is freed at once,
without a full garbage collection (which Python seldom runs when the memory is a few large
tensors), and a finished plan holds its cost tables and nothing else of the search.

Every check runs with the collector off (``gc.disable``): what survives there is held in a
reference cycle. Independent of the code under test: weak references to the model and its
weights, tracemalloc's count of live Python and numpy memory, and a walk of every object the plan
reaches.
"""

import gc
import sys
import tracemalloc
import weakref

import numpy as np
import pytest
import torch
import torch.nn as nn

import autopar


class LoopOverBatch(nn.Module):
    """A Python loop over the batch size: fx cannot trace it, an export with a dynamic batch fails
    (the loop fixes the size), an export with a static batch works."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 64)
        self.b = nn.Linear(64, 8)

    def forward(self, x):
        for _ in range(x.shape[0] // 4):
            x = x * 1.0
        return self.b(torch.relu(self.a(x))).sum()


def _rnnlm():
    """PaSE's RNNLM, small: ``x, _ = self.lstm(...)`` unpacks an fx Proxy while tracing."""
    model, inputs = autopar.zoo.get("rnnlm", batch=4, seq=8, vocab=512, units=64)
    return model, inputs, dict(cost_model="pase", space="pase:1")


def _loop():
    return LoopOverBatch(), (torch.randn(8, 32),), {}


@pytest.fixture(scope="module")
def warm():
    """Each path planned once first: torch's lazy imports on a first call (torch._dynamo under a
    decomposition) keep that call's frames in cycles of the import machinery."""
    for build in (_rnnlm, _loop):
        _plan_and_drop(build, 4)
    gc.collect()


@pytest.fixture
def no_collector(warm):
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _plan_and_drop(build, devices: int):
    """Plan a fresh model, drop everything; weak references to what must be gone."""
    model, inputs, kw = build()
    plan = autopar.plan(model, inputs, autopar.Cluster(devices=devices), **kw)
    return {"model": weakref.ref(model), "plan": weakref.ref(plan),
            **{f"weight {name}": weakref.ref(p) for name, p in model.named_parameters()}}


@pytest.mark.parametrize("build,frontend", [(_rnnlm, "fx"), (_loop, "export")], ids=["fx-rnnlm", "export-loop"])
def test_a_dropped_model_and_its_plan_are_freed_without_a_garbage_collection(no_collector, build, frontend):
    model, inputs, _ = build()
    assert autopar.trace(model, inputs).frontend == frontend  # the path this case is for
    del model, inputs
    for devices in (4, 8, 16):
        refs = _plan_and_drop(build, devices)
        alive = [name for name, r in refs.items() if r() is not None]
        assert not alive, f"planned on {devices} devices and dropped, still alive (in cycles): {alive}"


def _live_numpy_bytes() -> int:
    """Bytes of numpy array data alive now (numpy reports its buffers to tracemalloc in a domain of its own)."""
    numpy_only = tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)
    snap = tracemalloc.take_snapshot().filter_traces([numpy_only])
    return sum(stat.size for stat in snap.statistics("filename"))


def test_planning_again_and_again_stays_flat(no_collector):
    """numpy memory live after each plan (model and plan dropped) does not grow: no plan's cost
    tables or search state outlive it. (Python objects are not counted: torch leaves small cycles
    of its own, recursive closures of pytree and fx, that the young generations collect.)"""
    tracemalloc.start()
    try:
        live = []
        for devices in (4, 8, 16, 4, 8, 16):
            _plan_and_drop(_rnnlm, devices)
            live.append(_live_numpy_bytes())
    finally:
        tracemalloc.stop()
    assert live[-1] <= live[2] + 4096, f"live numpy bytes after each plan: {live}"


def _reachable_arrays(root, skip=()) -> list[np.ndarray]:
    """Every numpy array reachable from ``root`` through gc referents (modules, types and the
    objects in ``skip`` not entered)."""
    seen, stack, out = {id(s) for s in skip}, [root], []
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, np.ndarray):
            out.append(o)
            continue
        if isinstance(o, (type, type(sys))):
            continue
        stack.extend(gc.get_referents(o))
    return out


def test_a_finished_plan_holds_its_cost_tables_and_no_search_state(no_collector):
    model, inputs = autopar.zoo.get("rnnlm", batch=64, device="meta")
    plan = autopar.plan(model, inputs, autopar.Cluster(devices=16), cost_model="pase", space="pase:1")
    t = plan.tables
    own = [*t.node_cost, *t.edge_cost.values(), *t.memory]
    held = _reachable_arrays(plan)
    extra = [a for a in held if not any(a is o or a.base is o for o in own)]
    assert sum(a.nbytes for a in extra) < 64 * 1024, \
        f"the plan holds {len(extra)} arrays besides its cost tables: {sum(a.nbytes for a in extra)} bytes"
    assert sum(a.nbytes for a in held) <= sum(a.nbytes for a in own) + 64 * 1024
