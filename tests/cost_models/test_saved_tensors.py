"""The activations the memory model keeps for a training step against what autograd really keeps:
the bytes of the distinct storages torch's saved-tensor hooks see for small models, each op
family's backward formula read from torch itself, never from the code under test."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import autopar
from autopar.core.ir import FROZEN_PARAMS
from autopar.cost_models.memory import node_memory
from autopar.frontend.trace import trace
from tests.cost_models.test_memory import modelled_activations, replicated, saved_bytes


@pytest.mark.parametrize("attention", ["sdpa", "manual"])
def test_a_llama_block_keeps_what_autograd_keeps(attention):
    """A Llama block (RMSNorm, rotary tables as buffers, grouped-query attention, SwiGLU) and its
    loss: a rotary product keeps its table, not the queries; the fused kernel keeps the grouped
    keys and values, its output (the output projection's input, the same storage) and its
    log-sum-exp; written out, the masked fill keeps its mask, not the scores. The model's total
    is autograd's within 0.1% (the loss's 4-byte total weight, not modelled)."""
    model, (idx, labels) = autopar.zoo.get("llama", batch=2, seq=16, width=64, heads=4, kv_heads=2, ffn=96,
                                           layers=2, vocab=128, attention=attention)
    measured = saved_bytes(model, idx, labels)
    assert modelled_activations(trace(model, (idx, labels))) == pytest.approx(measured, rel=1e-3)


class _Ops(torch.nn.Module):
    """A relu read by a linear (one tensor: relu keeps its result), a division by a tensor that
    needs no gradient (keeps the divisor only), a ``where`` and a ``masked_fill`` (their condition
    only), a product of two activations (each factor), a frozen linear (keeps nothing for a weight
    that takes no gradient)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 48), torch.nn.Linear(48, 48)
        self.frozen = torch.nn.Linear(48, 48)
        self.frozen.requires_grad_(False)

    def forward(self, x, scale):
        h = self.b(torch.relu(self.a(x)))
        h = h / scale
        h = torch.where(scale > 1.0, h, torch.zeros_like(h))
        h = h.masked_fill(scale < 0.5, 0.0)
        return (self.frozen(h) * h).sum()


def test_each_op_keeps_only_what_its_backward_reads():
    model, x, scale = _Ops(), torch.randn(8, 12, 32), torch.rand(8, 12, 1) + 0.5
    measured = saved_bytes(model, x, scale)
    f32 = 8 * 12 * 4
    # x, relu's result, the divisor, the two conditions (bool), the frozen linear's output and h
    assert measured == f32 * (32 + 48 + 1) + 2 * 8 * 12 + 2 * f32 * 48
    assert modelled_activations(trace(model, (x, scale))) == measured


def test_a_frozen_parameter_holds_no_gradient_or_optimizer_state():
    """``requires_grad=False`` and buffers: the trace marks them, and the memory model gives them
    their bytes only (no gradient, no Adam moments), as torch's optimizer holds none for them."""
    model, x, scale = _Ops(), torch.randn(8, 12, 32), torch.rand(8, 12, 1) + 0.5
    graph = trace(model, (x, scale))
    node = next(n for n in graph.nodes if any(p.source == "param:frozen.weight" for p in n.params))
    assert node.attrs[FROZEN_PARAMS] == (0, 1)
    from autopar.core.tables import Mesh

    mem = node_memory(node, replicated(graph)[node.name], Mesh((1,), (0,)))
    assert mem.params == 4 * (48 * 48 + 48) and mem.grads == 0 and mem.optimizer == 0
    trainable = next(n for n in graph.nodes if any(p.source == "param:b.weight" for p in n.params))
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad])
    model(x, scale).backward()
    opt.step()
    held = sum(t.nbytes for st in opt.state.values() for t in st.values() if t.dim())  # the moments
    assert held == 2 * 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert FROZEN_PARAMS not in trainable.attrs


@pytest.mark.parametrize("listed", [False, True], ids=["stacked", "module-list"])
def test_routed_experts_keep_what_autograd_keeps_inside_them(listed):
    """A routed experts node is one node of the graph, but its code runs each expert on its
    tokens and autograd keeps, per routed token, the gathered input, the gate and up outputs,
    the activation, the down projection's output, the weighted output and the indices: the
    model's total is autograd's within 0.1% (it counted the node's inputs only: 0.12x)."""
    model, inputs = autopar.zoo.get("moe", width=48, hidden=96, top_k=3, listed=listed)
    measured = saved_bytes(model, *inputs)
    assert modelled_activations(trace(model, inputs)) == pytest.approx(measured, rel=1e-3)


def test_a_max_pool_keeps_its_input_and_the_positions_of_its_maxima():
    """conv -> relu -> max pool -> linear: the relu's result (read by the pool too), and the
    pool's int64 argmax per window, the size of its output, as the saved-tensor hooks see."""

    class Pool(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.fc = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Linear(8 * 8 * 8, 10)

        def forward(self, x):
            return self.fc(F.max_pool2d(torch.relu(self.conv(x)), 2).flatten(1)).sum()

    model, x = Pool(), torch.randn(4, 3, 16, 16)
    measured = saved_bytes(model, x)
    assert measured == x.nbytes + 4 * 8 * 16 * 16 * 4 + 4 * 8 * 8 * 8 * (8 + 4)  # x, relu, argmax + pooled
    assert modelled_activations(trace(model, (x,))) == measured
