"""Run one ``ir.Node``'s op on random tensors of its *local* shapes, and time it.

The profiled cost model needs what one device does under a config: the node's operands cut by
the config's splits (an axis indexed by dims ``(h, d)`` is divided by ``split[h] * split[d]``),
the op applied to them, then its backward. The op is rebuilt from ``node.op``/``attrs`` alone (no
model, no fx graph), so a timing depends only on what is in the signature and can be cached.
Ops it cannot rebuild raise ``NotRunnable``; the cost model then falls back to its estimate.
"""

from __future__ import annotations

import math
import operator
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from autopar.core.ir import Node, TensorSpec
from autopar.core.tables import Config

FLOAT = {"float64", "float32", "float16", "bfloat16"}


class NotRunnable(Exception):
    """The runner has no way to execute this op; the message says why."""


def local_shape(node: Node, config: Config, spec: TensorSpec) -> tuple[int, ...]:
    """The shard of ``spec`` one device holds under ``config``: each axis / its dims' splits."""
    split = {d.name: s for d, s in zip(node.dims, config.splits)}
    return tuple(max(1, size // math.prod(split.get(n, 1) for n in names))
                 for size, names in zip(spec.shape, spec.axes))


@dataclass
class OpCall:
    """A ready-to-time op: ``fn(*tensors)`` returns a tensor or a tuple of them."""

    fn: Callable
    tensors: list[torch.Tensor]
    params: tuple = ()  # leaves that are not arguments (an nn.LSTM's weights)


def _tensor(shape, dtype: str, device, high: int | None = None) -> torch.Tensor:
    if dtype in FLOAT:
        return torch.randn(shape, dtype=getattr(torch, dtype), device=device, requires_grad=True)
    if dtype == "bool":
        return torch.rand(shape, device=device) > 0.5
    return torch.randint(0, max(1, high or 2), shape, dtype=getattr(torch, dtype), device=device)


def _elementwise(attrs: dict) -> Callable:
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


def build(node: Node, config: Config, device="cpu") -> OpCall:
    """The node's op on random local operands (inputs then params, in the node's order)."""
    a = node.attrs
    ins = [op.spec for op in node.inputs]
    ps = [op.spec for op in node.params]
    loc = lambda spec: local_shape(node, config, spec)
    op = node.op
    if not node.outputs:
        raise NotRunnable("node has no outputs")
    if op == "linear":
        return OpCall(lambda x, w, *b: F.linear(x, w, *b), [_tensor(loc(s), s.dtype, device) for s in ins + ps])
    if op in ("matmul", "einsum"):
        ops = ins + ps
        bias = ops.pop(0) if a.get("bias") else None
        eq = _matmul_einsum(node, ops)
        ts = [_tensor(tuple(n for n, ax in zip(loc(s), s.axes) if ax != () or n != 1), s.dtype, device)
              for s in ops]
        if bias is not None:
            ts.append(_tensor(loc(bias), bias.dtype, device))
            out_shape = loc(node.outputs[0])
            return OpCall(lambda *t: torch.einsum(eq, *t[:-1]).reshape(out_shape) + t[-1], ts)
        out_shape = loc(node.outputs[0])
        return OpCall(lambda *t: torch.einsum(eq, *t).reshape(out_shape), ts)
    if op in ("conv1d", "conv2d", "conv3d"):
        conv = getattr(F, op)
        x, w = _tensor(loc(ins[0]), ins[0].dtype, device), _tensor(loc(ps[0]), ps[0].dtype, device)
        groups = max(1, x.shape[1] // w.shape[1])
        ts = [x, w] + [_tensor(loc(s), s.dtype, device) for s in ps[1:2]]
        kw = dict(stride=a.get("stride", 1), padding=a.get("padding", 0), dilation=a.get("dilation", 1),
                  groups=groups)
        return OpCall(lambda x, w, *b: conv(x, w, b[0] if b else None, **kw), ts)
    if op == "embedding":
        w = _tensor(loc(ps[0]), ps[0].dtype, device)
        idx = _tensor(loc(ins[0]), ins[0].dtype, device, high=w.shape[0])
        return OpCall(lambda i, w: F.embedding(i, w), [idx, w])
    if op == "layer_norm":
        ns = tuple(a.get("normalized_shape", ins[0].shape[-1:]))
        ts = [_tensor(loc(s), s.dtype, device) for s in ins[:1] + ps]
        return OpCall(lambda x, *wb: F.layer_norm(x, x.shape[-len(ns):], *wb, eps=a.get("eps", 1e-5)), ts)
    if op == "batch_norm":
        by = {p.source.rsplit(".", 1)[-1]: p.spec for p in node.params}
        x = _tensor(loc(ins[0]), ins[0].dtype, device)
        c = x.shape[1]
        stats = [torch.zeros(c, device=device), torch.ones(c, device=device)]
        ts = [x] + [_tensor((c,), by[k].dtype, device) for k in ("weight", "bias") if k in by]
        aff = len(ts) == 3
        return OpCall(lambda x, *wb: F.batch_norm(x, *stats, *(wb if aff else (None, None)),
                                                  training=bool(a.get("training", True)),
                                                  momentum=0.0, eps=a.get("eps", 1e-5)), ts)
    if op in ("softmax", "log_softmax"):
        f = getattr(torch, op)
        return OpCall(lambda x: f(x, a["axis"]), [_tensor(loc(ins[0]), ins[0].dtype, device)])
    if op == "sdpa":
        ts = [_tensor(loc(s), s.dtype, device) for s in ins[:3]]
        if a.get("mask") and len(ins) > 3:
            m = ins[3]
            ts.append(_tensor(loc(m), m.dtype, device) if m.dtype == "bool"
                      else torch.zeros(loc(m), dtype=getattr(torch, m.dtype), device=device))
        return OpCall(lambda q, k, v, *m: F.scaled_dot_product_attention(
            q, k, v, m[0] if m else None, is_causal=bool(a.get("is_causal")) and not m,
            scale=a.get("scale")), ts)
    if op == "elementwise":
        return OpCall(_elementwise(a), [_tensor(loc(s), s.dtype, device) for s in ins])
    if op == "dropout":
        return OpCall(lambda x: F.dropout(x, a.get("p", 0.5), a.get("training", True)),
                      [_tensor(loc(ins[0]), ins[0].dtype, device)])
    if op == "reduce":
        f = getattr(torch, a.get("fn", "sum"))
        axes, keep = tuple(a.get("axes", ())), bool(a.get("keepdim"))
        return OpCall(lambda x: f(x, dim=axes, keepdim=keep), [_tensor(loc(ins[0]), ins[0].dtype, device)])
    if op in ("view", "identity"):
        out = loc(node.outputs[0])
        return OpCall(lambda x: x.reshape(out).contiguous(), [_tensor(loc(ins[0]), ins[0].dtype, device)])
    if op == "permute" and "perm" in a:
        return OpCall(lambda x: x.permute(a["perm"]), [_tensor(loc(ins[0]), ins[0].dtype, device)])
    if op == "cat":
        ax, stack = a.get("axis", 0), a.get("new_axis", False)
        return OpCall(lambda *t: (torch.stack if stack else torch.cat)(t, ax),
                      [_tensor(loc(s), s.dtype, device) for s in ins])
    if op == "split":
        x = _tensor(loc(ins[0]), ins[0].dtype, device)
        ax = a.get("axis", 0)
        if a.get("squeeze"):
            return OpCall(lambda x: x.unbind(ax), [x])
        sizes = [loc(o)[ax] for o in node.outputs]
        return OpCall(lambda x: x.split(sizes, ax), [x])
    if op == "slice":
        src = (ins + ps)[0]
        out = loc(node.outputs[0])
        x = _tensor(loc(src), src.dtype, device)
        if x.ndim != len(out):
            raise NotRunnable("slice that drops an axis (select)")
        return OpCall(lambda x: x[tuple(slice(0, n) for n in out)], [x])
    if op == "pool":
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
        return OpCall(fn, [_tensor(loc(ins[0]), ins[0].dtype, device)])
    if op == "lstm":
        return _lstm(node, config, device)
    if op == "cross_entropy":
        x = _tensor(loc(ins[0]), ins[0].dtype, device)
        t = _tensor(loc(ins[1]), ins[1].dtype, device, high=x.shape[1] if x.ndim > 1 else x.shape[0])
        red = a.get("reduction", "mean")
        return OpCall(lambda x, t: F.cross_entropy(x, t, reduction=red,
                                                   label_smoothing=a.get("label_smoothing", 0.0)), [x, t])
    raise NotRunnable(f"no runner for op {op!r}")


def _lstm(node: Node, config: Config, device) -> OpCall:
    a = node.attrs
    x_spec = node.inputs[0].spec
    x = _tensor(local_shape(node, config, x_spec), x_spec.dtype, device)
    w_ih = local_shape(node, config, node.params[0].spec)
    hidden = w_ih[0] // 4
    if hidden * 4 != w_ih[0]:
        raise NotRunnable("lstm gate rows not a multiple of 4 under this split")
    lstm = torch.nn.LSTM(x.shape[-1], hidden, a.get("layers", 1), bias=a.get("bias", True),
                         batch_first=a.get("batch_first", False),
                         bidirectional=a.get("bidirectional", False)).to(device, x.dtype)
    return OpCall(lambda x: lstm(x)[0], [x], tuple(lstm.parameters()))


def clock(device="cpu") -> Callable[[], float]:
    """The clock a timing reads: on a CPU running torch on one thread, this thread's CPU time.

    One thread means the op (forward and autograd's backward alike) runs on the calling thread,
    so its CPU time is its work on the core, including memory stalls, but not the time the OS
    gave the core to other processes: on a shared machine, wall time would charge each op for
    whatever else ran at the moment it was measured. GPUs and multi-threaded CPUs use wall time.
    """
    if torch.device(device).type == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _leaves(call: OpCall) -> list[torch.Tensor]:
    return [t for t in call.tensors if t.requires_grad] + list(call.params)


def _run_fb(call: OpCall, grads: list | None) -> None:
    out = call.fn(*call.tensors)
    outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,))
            if isinstance(o, torch.Tensor) and o.requires_grad]
    if grads is not None and outs:
        # autograd.grad, not backward: no .grad accumulation, which a real step would not time
        torch.autograd.grad(outs, _leaves(call), grads[: len(outs)], allow_unused=True)


def time_op(call: OpCall, backward: bool = True, repeats: int = 5, warmup: int = 2,
            device="cpu") -> tuple[float, float | None]:
    """(median forward seconds, median backward seconds or None), each over ``repeats`` runs.

    Backward is timed as forward+backward minus forward (autograd cannot run a backward without
    its forward), clamped at zero.
    """
    grads = None
    if backward and _leaves(call):
        out = call.fn(*call.tensors)
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,))
                if isinstance(o, torch.Tensor) and o.requires_grad]
        grads = [torch.randn_like(o) for o in outs] if outs else None

    now = clock(device)

    def timed(f) -> float:
        for _ in range(warmup):
            f()
        _sync(device)
        ts = []
        for _ in range(repeats):
            t = now()
            f()
            _sync(device)
            ts.append(now() - t)
        return statistics.median(ts)

    fwd = timed(lambda: _run_fb(call, None))
    if grads is None:
        return fwd, (0.0 if backward else None)
    fb = timed(lambda: _run_fb(call, grads))
    return fwd, max(fb - fwd, 0.0)


OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}


EVICT_BYTES = 64 * 2**20  # written before each timed CPU update: twice the development machine's L3 (32 MiB)


def time_optimizer(name: str, shapes: list[tuple[tuple[int, ...], str]], repeats: int = 5,
                   warmup: int = 2, device="cpu", evict: torch.Tensor | None = None) -> float:
    """Median seconds of one ``torch.optim`` update of parameters of these local shapes.

    The optimizer is built as the generated module's ``optimizer()`` builds it (``foreach=True``:
    on a CPU torch's default is its per-tensor loop, 13.2 ms against foreach's 10.1 ms for the
    zoo mlp's AdamW here), gradients are set, and its state is created by the warm-up steps, so
    only the steady-state update is timed. With ``evict`` (a buffer of ``EVICT_BYTES``, made once
    by the caller) each timed update starts cold: in a step the rest of the model's update and the
    backward have gone through the caches since this node's state was last touched, and an update
    timed hot, again and again on a few MiB, is the cache's speed (the zoo mlp's nodes summed:
    5.8 ms hot, 8.2 ms cold, 10.8 ms for the whole model's update in one optimizer).
    """
    if name not in OPTIMIZERS:
        raise NotRunnable(f"optimizer {name!r} unknown to the runner (know {', '.join(OPTIMIZERS)})")
    params = []
    for shape, dtype in shapes:
        p = torch.randn(shape, dtype=getattr(torch, dtype), device=device, requires_grad=True)
        p.grad = torch.randn_like(p)
        params.append(p)
    opt = getattr(torch.optim, OPTIMIZERS[name])(params, lr=1e-3, foreach=True)
    for _ in range(max(1, warmup)):
        opt.step()
    _sync(device)
    now = clock(device)
    ts = []
    for _ in range(repeats):
        if evict is not None:
            evict.fill_(1.0)  # the caches hold something else, as in a step
        t = now()
        opt.step()
        _sync(device)
        ts.append(now() - t)
    return statistics.median(ts)
