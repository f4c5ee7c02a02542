"""Which nodes are weight views, and which reader gradients pass on to the weight's bucket.

The end-to-end check (the generated module issues what the cost model lists, with the GPT's
position-embedding slice in the gradient bucket) is ``tests/codegen/test_codegen_collectives.py``.
"""

import torch
from torch import nn

import autopar
from autopar.core.layout import Partial, Replicate, Shard
from autopar.core.weight_views import WEIGHT_VIEW, lifted_grad_axes

R, P = Replicate(), Partial()


def _views(model, *inputs, frontend="auto") -> dict[str, str]:
    g = autopar.trace(model, inputs, frontend=frontend)
    return {n.name: n.attrs[WEIGHT_VIEW] for n in g.nodes if WEIGHT_VIEW in n.attrs}


def test_the_gpt_position_slice_is_the_one_weight_view():
    model, inputs = autopar.zoo.get("gpt", layers=1, batch=2, seq=8, width=16, heads=2, vocab=32)
    for frontend in ("fx", "export"):
        views = _views(model, *inputs, frontend=frontend)
        assert list(views.values()) == ["param:pos.weight"], frontend  # not tok: it reads the tokens


class _Shared(nn.Module):
    """A weight read by two nodes, a view read twice, a view returned: none is a weight view."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.randn(8, 4))
        self.b = nn.Parameter(torch.randn(8, 4))
        self.c = nn.Parameter(torch.randn(8, 4))

    def forward(self, x):
        twice = self.a[:4] + self.a[4:]  # weight a read by two slices
        v = self.b[:4]
        both = x * v + v  # the view of b read by two nodes
        return (x + twice + both).sum(), self.c[:4]  # the view of c is a graph output


class _Once(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 4))

    def forward(self, x):
        return (x + self.w[:4]).sum()


def test_shared_weights_shared_views_and_returned_views_are_not_weight_views():
    assert _views(_Shared(), torch.randn(4, 4)) == {}
    assert list(_views(_Once(), torch.randn(4, 4)).values()) == ["param:w"]


def test_lifted_axes_only_where_nothing_else_moves():
    model, inputs = autopar.zoo.get("gpt", layers=1, batch=2, seq=8, width=16, heads=2, vocab=32)
    g = autopar.trace(model, inputs)
    view = next(n for n in g.nodes if WEIGHT_VIEW in n.attrs)
    other = next(n for n in g.nodes if n.op == "linear")
    # data parallel on a (2, 2) mesh: the reader's gradient is a partial sum on both axes
    assert lifted_grad_axes(view, (R, R), (R, R), (P, P)) == (0, 1)
    assert lifted_grad_axes(view, (R, R), (R, R), (P, R)) == (0,)
    assert lifted_grad_axes(view, (R, R), (R, R), (R, R)) == ()  # nothing partial: nothing to pass on
    assert lifted_grad_axes(other, (R, R), (R, R), (P, P)) == ()  # not a weight view
    assert lifted_grad_axes(view, (Shard(0), R), (Shard(0), R), (Shard(0), P)) == ()  # view split
    assert lifted_grad_axes(view, (R, R), (Shard(0), R), (Shard(0), P)) == ()  # the reader reshards it
    assert lifted_grad_axes(view, (R, R), (R, R), (Shard(1), P)) == ()  # a gradient to reshard
