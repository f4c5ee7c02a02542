"""How to run one node alone for profiling: a runner per op family, ``(node, config, device) -> OpCall``.

The profiled cost model needs what one device does under a config: the node's operands cut by
the config's splits (an axis indexed by dims ``(h, d)`` is divided by ``split[h] * split[d]``),
the op applied to them, then its backward. A runner rebuilds the op from ``node.op``/``attrs``
alone (no model, no fx graph), so a timing depends only on what is in the signature and can be
cached. ``RUNNERS`` maps each ``Node.op`` kind to the runner its family names
(``autopar.core.op_families``); an op it cannot rebuild raises ``NotRunnable`` and the cost model
keeps its estimate.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from autopar.core.backward import grad_free_inputs
from autopar.core.ir import Node
from autopar.core.op_families import FAMILIES
from autopar.core.tables import Config
from autopar.cost_models.op_call import NotRunnable, OpCall, local_shape, make_tensor


class _Local:
    """A node's operand specs (inputs, params) and random tensors of their local shapes."""

    def __init__(self, node: Node, config: Config, device):
        self.node, self.config, self.device = node, config, device
        self.ins = [op.spec for op in node.inputs]
        self.ps = [op.spec for op in node.params]
        # the inputs that take no gradient in the model (the data batch, a mask) are made without
        # one, so the backward timed is the one a step runs; by the spec object the runner passes
        free = set(grad_free_inputs(node))
        taking = {id(s) for i, s in enumerate(self.ins) if i not in free}
        self.free = {id(self.ins[i]) for i in free if i < len(self.ins)} - taking

    def shape(self, spec) -> tuple[int, ...]:
        return local_shape(self.node, self.config, spec)

    def tensor(self, spec, high: int | None = None, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        t = make_tensor(self.shape(spec) if shape is None else shape, spec.dtype, self.device, high)
        return t.requires_grad_(False) if id(spec) in self.free and t.requires_grad else t

    def tensors(self, specs) -> list[torch.Tensor]:
        return [self.tensor(s) for s in specs]

    def first(self) -> torch.Tensor:
        return self.tensor(self.ins[0])


def linear(node: Node, config: Config, device) -> OpCall:
    t = _Local(node, config, device)
    return OpCall(lambda x, w, *b: F.linear(x, w, *b), t.tensors(t.ins + t.ps))


def _matmul_einsum(node: Node, operands: list) -> str:
    """An einsum equation from the operands' axis maps: a matmul is an einsum of its dims."""
    letters = {d.name: chr(ord("a") + i) for i, d in enumerate(node.dims)}
    if len(letters) > 26:
        raise NotRunnable("too many dims for an einsum")
    terms = []
    for spec in operands + [node.outputs[0]]:
        term = ""
        for names, size in zip(spec.axes, spec.shape):
            if len(names) != 1:
                if names == () and size == 1:
                    continue  # a broadcast axis: squeezed before the call
                raise NotRunnable(f"merged or unsplittable axis {names} in a matmul operand")
            term += letters[names[0]]
        terms.append(term)
    return ",".join(terms[:-1]) + "->" + terms[-1]


def einsum(node: Node, config: Config, device) -> OpCall:
    """``matmul`` and ``einsum`` nodes: an einsum of their dims (and a bias added after)."""
    t = _Local(node, config, device)
    ops = t.ins + t.ps
    bias = ops.pop(0) if node.attrs.get("bias") else None
    eq = _matmul_einsum(node, ops)
    ts = [t.tensor(s, shape=tuple(n for n, ax in zip(t.shape(s), s.axes) if ax != () or n != 1)) for s in ops]
    out_shape = t.shape(node.outputs[0])
    if bias is not None:
        ts.append(t.tensor(bias))
        return OpCall(lambda *x: torch.einsum(eq, *x[:-1]).reshape(out_shape) + x[-1], ts)
    return OpCall(lambda *x: torch.einsum(eq, *x).reshape(out_shape), ts)


def conv(node: Node, config: Config, device) -> OpCall:
    t, a = _Local(node, config, device), node.attrs
    fn = getattr(F, node.op)
    x, w = t.first(), t.tensor(t.ps[0])
    groups = max(1, x.shape[1] // w.shape[1])
    kw = dict(stride=a.get("stride", 1), padding=a.get("padding", 0), dilation=a.get("dilation", 1), groups=groups)
    return OpCall(lambda x, w, *b: fn(x, w, b[0] if b else None, **kw), [x, w] + t.tensors(t.ps[1:2]))


def embedding(node: Node, config: Config, device) -> OpCall:
    t = _Local(node, config, device)
    w = t.tensor(t.ps[0])
    return OpCall(lambda i, w: F.embedding(i, w), [t.tensor(t.ins[0], high=w.shape[0]), w])


def layer_norm(node: Node, config: Config, device) -> OpCall:
    t, a = _Local(node, config, device), node.attrs
    ns = tuple(a.get("normalized_shape", t.ins[0].shape[-1:]))
    return OpCall(lambda x, *wb: F.layer_norm(x, x.shape[-len(ns):], *wb, eps=a.get("eps", 1e-5)),
                  t.tensors(t.ins[:1] + t.ps))


def batch_norm(node: Node, config: Config, device) -> OpCall:
    t, a = _Local(node, config, device), node.attrs
    by = {p.source.rsplit(".", 1)[-1]: p.spec for p in node.params}
    x = t.first()
    c = x.shape[1]
    stats = [torch.zeros(c, device=device), torch.ones(c, device=device)]
    ts = [x] + [make_tensor((c,), by[k].dtype, device) for k in ("weight", "bias") if k in by]
    aff = len(ts) == 3
    return OpCall(lambda x, *wb: F.batch_norm(x, *stats, *(wb if aff else (None, None)),
                                              training=bool(a.get("training", True)),
                                              momentum=0.0, eps=a.get("eps", 1e-5)), ts)


def softmax(node: Node, config: Config, device) -> OpCall:
    f = getattr(torch, node.op)
    return OpCall(lambda x: f(x, node.attrs["axis"]), [_Local(node, config, device).first()])


def sdpa(node: Node, config: Config, device) -> OpCall:
    t, a = _Local(node, config, device), node.attrs
    ts = t.tensors(t.ins[:3])
    if a.get("mask") and len(t.ins) > 3:
        m = t.ins[3]
        ts.append(t.tensor(m) if m.dtype == "bool"
                  else torch.zeros(t.shape(m), dtype=getattr(torch, m.dtype), device=device))
    return OpCall(lambda q, k, v, *m: F.scaled_dot_product_attention(
        q, k, v, m[0] if m else None, is_causal=bool(a.get("is_causal")) and not m, scale=a.get("scale")), ts)


def _elementwise_fn(attrs: dict) -> Callable:
    fn = attrs.get("fn", "")
    if fn == "to":
        return lambda x: x.to(getattr(torch, attrs["dtype"]))
    f = getattr(operator, fn, None) or getattr(F, fn, None) or getattr(torch, fn, None)
    if f is None:
        raise NotRunnable(f"elementwise fn {fn!r} unknown to the runner")
    if "scalar" in attrs:
        s = attrs["scalar"]
        return (lambda x: f(s, x)) if attrs.get("scalar_first") else (lambda x: f(x, s))
    return f


def elementwise(node: Node, config: Config, device) -> OpCall:
    t = _Local(node, config, device)
    return OpCall(_elementwise_fn(node.attrs), t.tensors(t.ins))


def dropout(node: Node, config: Config, device) -> OpCall:
    a = node.attrs
    return OpCall(lambda x: F.dropout(x, a.get("p", 0.5), a.get("training", True)),
                  [_Local(node, config, device).first()])


def reduce(node: Node, config: Config, device) -> OpCall:
    a = node.attrs
    f = getattr(torch, a.get("fn", "sum"))
    axes, keep = tuple(a.get("axes", ())), bool(a.get("keepdim"))
    return OpCall(lambda x: f(x, dim=axes, keepdim=keep), [_Local(node, config, device).first()])


def reshape(node: Node, config: Config, device) -> OpCall:
    """``view`` and ``identity`` nodes: a copy into the output's local shape."""
    t = _Local(node, config, device)
    out = t.shape(node.outputs[0])
    return OpCall(lambda x: x.reshape(out).contiguous(), [t.first()])


def permute(node: Node, config: Config, device) -> OpCall:
    if "perm" not in node.attrs:
        raise NotRunnable(f"no runner for op {node.op!r}")
    return OpCall(lambda x: x.permute(node.attrs["perm"]), [_Local(node, config, device).first()])


def cat(node: Node, config: Config, device) -> OpCall:
    t, a = _Local(node, config, device), node.attrs
    ax, stack = a.get("axis", 0), a.get("new_axis", False)
    return OpCall(lambda *x: (torch.stack if stack else torch.cat)(x, ax), t.tensors(t.ins))


def split(node: Node, config: Config, device) -> OpCall:
    t, a = _Local(node, config, device), node.attrs
    x = t.first()
    ax = a.get("axis", 0)
    if a.get("squeeze"):
        return OpCall(lambda x: x.unbind(ax), [x])
    sizes = [t.shape(o)[ax] for o in node.outputs]
    return OpCall(lambda x: x.split(sizes, ax), [x])


def slice_(node: Node, config: Config, device) -> OpCall:
    t = _Local(node, config, device)
    out = t.shape(node.outputs[0])
    x = t.tensor((t.ins + t.ps)[0])
    if x.ndim != len(out):
        raise NotRunnable("slice that drops an axis (select)")
    return OpCall(lambda x: x[tuple(slice(0, n) for n in out)], [x])


def pool(node: Node, config: Config, device) -> OpCall:
    a = node.attrs
    nd, kind = a.get("ndim", 2), a.get("kind", "max")
    if a.get("adaptive"):
        f = getattr(F, f"adaptive_{kind}_pool{nd}d")
        fn = lambda x: f(x, a["output_size"])
    elif kind == "max":
        f = getattr(F, f"max_pool{nd}d")
        fn = lambda x: f(x, a["kernel"], a["stride"], a["padding"], a.get("dilation", 1),
                         ceil_mode=a.get("ceil_mode", False))
    else:
        f = getattr(F, f"avg_pool{nd}d")
        fn = lambda x: f(x, a["kernel"], a["stride"], a["padding"], a.get("ceil_mode", False))
    return OpCall(fn, [_Local(node, config, device).first()])


def lstm(node: Node, config: Config, device) -> OpCall:
    t, a = _Local(node, config, device), node.attrs
    x = t.first()
    w_ih = t.shape(node.params[0].spec)
    hidden = w_ih[0] // 4
    if hidden * 4 != w_ih[0]:
        raise NotRunnable("lstm gate rows not a multiple of 4 under this split")
    module = torch.nn.LSTM(x.shape[-1], hidden, a.get("layers", 1), bias=a.get("bias", True),
                           batch_first=a.get("batch_first", False),
                           bidirectional=a.get("bidirectional", False)).to(device, x.dtype)
    return OpCall(lambda x: module(x)[0], [x], tuple(module.parameters()))


def cross_entropy(node: Node, config: Config, device) -> OpCall:
    t, a = _Local(node, config, device), node.attrs
    x = t.first()
    target = t.tensor(t.ins[1], high=x.shape[1] if x.ndim > 1 else x.shape[0])
    red = a.get("reduction", "mean")
    return OpCall(lambda x, y: F.cross_entropy(x, y, reduction=red, label_smoothing=a.get("label_smoothing", 0.0)),
                  [x, target])


# Node.op kind -> its family's runner
RUNNERS: dict[str, Callable[[Node, Config, object], OpCall]] = {
    op: getattr(sys.modules[__name__], f.runner) for f in FAMILIES if f.runner for op in f.ops}
