"""compile() after plan() reuses the plan's graph only when it is this very model and call.

A spy on ``autopar.frontend.trace.trace`` counts the traces; each case changes one thing the
trace depended on (a submodule, train/eval mode, an input shape, another model object) and must
trace again. A graph sent to another process (pickled) is never taken for a trace of a model
there."""

from __future__ import annotations

import pickle

import pytest
import torch

import autopar
import autopar.frontend.trace as tracing
from autopar.frontend.reuse import is_trace_of


@pytest.fixture
def traces(monkeypatch):
    calls = []
    real = tracing.trace

    def spy(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(tracing, "trace", spy)
    return calls


def _mlp():
    torch.manual_seed(0)
    return autopar.zoo.get("mlp", batch=8, inputs=16, hidden=32, layers=2, classes=4)


def test_compile_right_after_plan_does_not_trace_again(traces):
    model, inputs = _mlp()
    plan = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=1))
    assert len(traces) == 1
    module = autopar.compile(model, inputs, plan=plan)
    assert len(traces) == 1
    assert torch.allclose(module(*inputs), model(*inputs))


@pytest.mark.parametrize("change", ["submodule", "eval", "batch", "other model"])
def test_a_changed_model_or_call_is_traced_again(traces, change):
    model, inputs = _mlp()
    plan = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=1))
    if change == "submodule":
        # another module in its place (an equal Linear would give the same graph: reusing is right then)
        model.head = torch.nn.Sequential(torch.nn.Linear(model.head.in_features, model.head.out_features))
    elif change == "eval":
        model.eval()
    elif change == "batch":
        inputs = tuple(t[:4] for t in inputs)
    else:
        model, inputs = _mlp()
    assert not is_trace_of(plan.graph, model, tuple(inputs), {})
    try:
        autopar.compile(model, inputs, plan=plan)
    except Exception:  # noqa: BLE001 - a plan for another batch may be refused; the trace is what is checked
        pass
    assert len(traces) == 2


def test_a_pickled_graph_is_no_trace_of_anything():
    model, inputs = _mlp()
    graph = autopar.trace(model, inputs)
    assert is_trace_of(graph, model, tuple(inputs), {})
    copy = pickle.loads(pickle.dumps(graph))
    assert not is_trace_of(copy, model, tuple(inputs), {})
