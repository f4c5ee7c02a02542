"""The profile times a node's backward as a step runs it: no gradient for an input that takes
none in the model. The first linear of an MLP reads the data batch, so autograd computes its
weight's and bias's gradients but never its input's; the op runner must not time that matmul
either. Checked against torch's own FLOP counter on the runner's backward, and against which
tensors require a gradient when the model itself runs."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import autopar
from autopar.core.backward import GRAD_FREE_INPUTS, grad_free_inputs
from autopar.core.tables import Config
from autopar.cost_models.op_runner import build
from autopar.cost_models.profiled import op_signature

BATCH, IN, HIDDEN, OUT = 8, 16, 32, 4


def _backward_flops(call) -> int:
    out = call.fn(*call.tensors)
    with FlopCounterMode(display=False) as counter:
        out.backward(torch.ones_like(out))
    return counter.get_total_flops()


def _whole(node) -> Config:
    return Config(tuple(1 for _ in node.dims))


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_the_first_linear_is_timed_without_its_inputs_gradient(frontend):
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT))
    graph = autopar.trace(model, (torch.randn(BATCH, IN),), frontend=frontend)
    first, last = [n for n in graph.nodes if n.op == "linear"]
    assert grad_free_inputs(first) == (0,) and grad_free_inputs(last) == ()

    # torch's count for what a step's autograd runs: dW only (2 B I H), against dW and dX
    assert _backward_flops(build(first, _whole(first))) == 2 * BATCH * IN * HIDDEN
    plain = type(first)(**{**first.__dict__, "attrs": {k: v for k, v in first.attrs.items() if k != GRAD_FREE_INPUTS}})
    assert _backward_flops(build(plain, _whole(first))) == 4 * BATCH * IN * HIDDEN
    # the cache keys the two apart, as their timings differ
    assert op_signature(first, _whole(first)) != op_signature(plain, _whole(first))


class _Masked(torch.nn.Module):
    """A mask made from the input alone (no gradient), added to scores that take one."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(IN, IN)

    def forward(self, x):
        mask = (x > 0).float() * -1.0
        return torch.relu(self.proj(x) + mask).sum()


class _Recorder(torch.fx.Interpreter):
    """Runs the traced module and keeps, per fx node, whether its value requires a gradient."""

    def __init__(self, gm):
        super().__init__(gm)
        self.grad: dict[str, bool] = {}

    def run_node(self, n):
        out = super().run_node(n)
        if isinstance(out, torch.Tensor):
            self.grad[n.name] = out.requires_grad
        return out


def _value(op) -> str:
    """The fx node whose value an operand is: a node's name, or a graph input's placeholder."""
    return op.source.split(":", 1)[1] if op.is_input else op.source


@pytest.mark.parametrize("make", [
    lambda: (torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT)),
             torch.randn(BATCH, IN)),
    lambda: (_Masked(), torch.randn(BATCH, IN)),
    lambda: autopar.zoo.get("gpt", attention="manual"),
    lambda: autopar.zoo.get("resmlp"),
], ids=["mlp", "masked", "gpt", "resmlp"])
def test_the_marks_are_what_autograd_computes_when_the_model_runs(make):
    model, x = make()
    x = tuple(x) if isinstance(x, (tuple, list)) else (x,)
    graph = autopar.trace(model, x, frontend="fx")
    rec = _Recorder(graph.fx_graph)
    rec.run(*x)
    checked = 0
    for node in graph.nodes:
        free = set(grad_free_inputs(node))
        for i, op in enumerate(node.inputs):
            if op.spec.dtype.startswith(("float", "bfloat")) and _value(op) in rec.grad:
                assert (i in free) == (not rec.grad[_value(op)]), (node.name, op.source)
                checked += 1
    assert checked >= len([n for n in graph.nodes if n.inputs]) // 2
    # and the op runner makes each input of a node as it was in the run
    made = 0
    for node in graph.nodes:
        try:
            call = build(node, _whole(node))
        except Exception:
            continue
        if node.op not in ("linear", "elementwise"):  # their tensors are their inputs, in order
            continue
        for i, op in enumerate(node.inputs):
            if _value(op) in rec.grad and call.tensors[i].is_floating_point():
                assert call.tensors[i].requires_grad == rec.grad[_value(op)], (node.name, i)
                made += 1
    assert made > 0
