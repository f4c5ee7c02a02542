"""Rules for layers, functional layers, attention and losses on stacked values.

A module with state is called as its fused form (``layers``), told whether its input is
stacked; the functional spellings (``F.linear(x, w, b)`` with a stacked ``w``) call the same
helpers. Stateless modules are pointwise (kept), per-channel (pools: run on the K models'
channels side by side), or spelled as their functional form (Flatten, Softmax, the losses).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autopar.fusion import layers, losses
from autopar.fusion.rewrite import Rewriter, arg

POINTWISE_MODULES = (nn.ReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU,
                     nn.Softplus, nn.Mish, nn.Hardtanh, nn.ReLU6, nn.Hardswish, nn.Hardsigmoid, nn.Dropout,
                     nn.AlphaDropout, nn.Identity, nn.LogSigmoid, nn.Softsign, nn.Tanhshrink)
CHANNEL_MODULES = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
                   nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d, nn.AdaptiveMaxPool1d,
                   nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d, nn.LPPool1d, nn.LPPool2d, nn.Dropout1d,
                   nn.Dropout2d, nn.Dropout3d, nn.Upsample)
CLASS_LOSSES = {nn.CrossEntropyLoss: losses.cross_entropy, nn.NLLLoss: losses.nll_loss}
ELEMENTWISE_LOSSES = {nn.MSELoss: F.mse_loss, nn.L1Loss: F.l1_loss, nn.SmoothL1Loss: F.smooth_l1_loss,
                      nn.HuberLoss: F.huber_loss, nn.BCELoss: F.binary_cross_entropy,
                      nn.BCEWithLogitsLoss: F.binary_cross_entropy_with_logits}


def _fold_call(rw: Rewriter, x, call) -> fx.Node:
    """(K, B, C, ...) -> (B, K*C, ...) -> op -> back: a per-channel op on all K models at once."""
    folded = rw.method("flatten", rw.method("transpose", x, 0, 1), 1, 2)
    return rw.method("transpose", rw.method("unflatten", call(folded), 1, (rw.k, -1)), 0, 1)


def module_rule(rw: Rewriter, n: fx.Node, args, kwargs):
    m = rw.root.get_submodule(n.target)
    if isinstance(m, tuple(set(layers.FUSED.values()))):
        if len(args) != 1 or kwargs:
            rw.fail(f"{type(m).__name__} called with more than its input")
        return rw.graph.call_module(n.target, (args[0],), {"stacked": rw.is_stacked(args[0])}), True
    if not rw.is_stacked((args, kwargs)):
        return rw.graph.call_module(n.target, tuple(args), dict(kwargs)), False
    x = args[0]
    if isinstance(m, POINTWISE_MODULES):
        return rw.graph.call_module(n.target, tuple(args), dict(kwargs)), True
    if isinstance(m, CHANNEL_MODULES):
        if not rw.is_stacked(x) or len(args) != 1 or kwargs or rw.rank(x) < 2:
            rw.fail(f"{type(m).__name__} on other than one batched stacked input")
        return _fold_call(rw, x, lambda f: rw.graph.call_module(n.target, (f,), {})), True
    if isinstance(m, nn.Flatten):
        r = rw.rank(x)
        return rw.method("flatten", x, rw.dim(m.start_dim, r), rw.dim(m.end_dim, r)), True
    if isinstance(m, nn.Unflatten):
        return rw.method("unflatten", x, rw.dim(m.dim, rw.rank(x)), m.unflattened_size), True
    if isinstance(m, (nn.Softmax, nn.LogSoftmax)):
        if m.dim is None:
            rw.fail(f"{type(m).__name__} without a dim")
        fn = F.softmax if isinstance(m, nn.Softmax) else F.log_softmax
        return rw.fn(fn, x, rw.dim(m.dim, rw.rank(x))), True
    if type(m) in CLASS_LOSSES:
        return _class_loss(rw, CLASS_LOSSES[type(m)], args[0], args[1], m.weight, m.ignore_index, m.reduction,
                           getattr(m, "label_smoothing", None)), True
    if type(m) in ELEMENTWISE_LOSSES:
        extra = {"beta": m.beta} if isinstance(m, nn.SmoothL1Loss) else {"delta": m.delta} if isinstance(m, nn.HuberLoss) else {}
        if isinstance(m, nn.BCEWithLogitsLoss):
            extra = {"weight": m.weight, "pos_weight": m.pos_weight}
        elif isinstance(m, nn.BCELoss):
            extra = {"weight": m.weight}
        return _elementwise_loss(rw, ELEMENTWISE_LOSSES[type(m)], args[0], args[1], m.reduction, extra), True
    rw.fail(f"{type(m).__name__} has no fusion rule")


# -- functional layers --------------------------------------------------------------------------

def _stacked_params(rw: Rewriter, *params) -> bool:
    return any(rw.is_stacked(p) for p in params)


def f_linear(rw, n, args, kwargs):
    x, w, b = arg(args, kwargs, 0, "input"), arg(args, kwargs, 1, "weight"), arg(args, kwargs, 2, "bias")
    if not _stacked_params(rw, w, b):
        return rw.graph.create_node(n.op, n.target, args, kwargs), True
    return rw.fn(layers.linear, x, rw.expand(w), rw.expand(b) if b is not None else None, rw.is_stacked(x)), True


def f_conv(rw, n, args, kwargs):
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    defaults = (None, None, None, 1, 0, 1, 1)
    x, w, b, stride, padding, dilation, groups = (arg(args, kwargs, i, k, d) for i, (k, d) in enumerate(zip(names, defaults)))
    if not _stacked_params(rw, w, b):
        if rw.rank(x) < 3:
            rw.fail("an unbatched convolution")
        return _fold_call(rw, x, lambda f: rw.fn(n.target, f, w, b, stride, padding, dilation, groups)), True
    if isinstance(padding, str):
        rw.fail("a convolution with string padding on per-model weights")
    flat = (lambda t: rw.method("flatten", rw.expand(t), 0, 1) if t is not None else None)
    return rw.fn(layers.conv, x, flat(w), flat(b), stride, padding, dilation, groups, rw.is_stacked(x), rw.k), True


def f_layer_norm(rw, n, args, kwargs):
    x, shape = arg(args, kwargs, 0, "input"), arg(args, kwargs, 1, "normalized_shape")
    w, b, eps = arg(args, kwargs, 2, "weight"), arg(args, kwargs, 3, "bias"), arg(args, kwargs, 4, "eps", 1e-5)
    if not _stacked_params(rw, w, b):
        return rw.graph.create_node(n.op, n.target, args, kwargs), True
    return rw.fn(layers.layer_norm, x, tuple(shape), rw.expand(w) if w is not None else None,
                 rw.expand(b) if b is not None else None, eps, rw.is_stacked(x), rw.k), True


def f_batch_norm(rw, n, args, kwargs):
    names = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
    defaults = (None, None, None, None, None, False, 0.1, 1e-5)
    x, rm, rv, w, b, training, momentum, eps = (arg(args, kwargs, i, k, d) for i, (k, d) in enumerate(zip(names, defaults)))
    if rm is not None and not rw.is_stacked(rm):
        rw.fail("batch_norm updating running statistics all models share")
    flat = [rw.method("flatten", rw.expand(t)) if t is not None else None for t in (rm, rv, w, b)]
    return rw.fn(layers.batch_norm, x, *flat, training, momentum, eps, rw.is_stacked(x), rw.k), True


def f_embedding(rw, n, args, kwargs):
    idx, w = arg(args, kwargs, 0, "input"), arg(args, kwargs, 1, "weight")
    pad = arg(args, kwargs, 2, "padding_idx")
    if not rw.is_stacked(w):
        return rw.graph.create_node(n.op, n.target, args, kwargs), True
    v = rw.shape(w)[1]
    offsets = rw.fn(operator.mul, rw.fn(torch.arange, rw.k, device=rw.fn(getattr, idx, "device")), v)
    return rw.fn(layers.embedding, idx, rw.method("flatten", w, 0, 1), offsets, pad, rw.is_stacked(idx)), True


def f_channels(rw, n, args, kwargs):
    """Pooling, interpolation: per channel, on the K models' channels side by side."""
    x = args[0]
    if rw.rank(x) < 2 or arg(args, kwargs, 99, "return_indices", False):
        rw.fail(f"{n.target.__name__} on an unbatched input or with return_indices")
    return _fold_call(rw, x, lambda f: rw.fn(n.target, f, *args[1:], **kwargs)), True


def f_attention(rw, n, args, kwargs):
    q, k, v = (rw.expand(arg(args, kwargs, i, name)) for i, name in enumerate(("query", "key", "value")))
    mask = arg(args, kwargs, 3, "attn_mask")
    rest = {name: arg(args, kwargs, i, name, d) for i, (name, d) in
            enumerate((("dropout_p", 0.0), ("is_causal", False), ("scale", None)), start=4)}
    r = rw.rank(q)
    if r < 3:  # (L, E): the K models are the batch
        return rw.fn(F.scaled_dot_product_attention, q, k, v, rw.expand(mask) if mask is not None else None,
                     **rest), True
    merge = (lambda t: rw.method("flatten", t, 0, 1))  # (K, N, ...) -> (K*N, ...): the kernel one model uses
    if mask is not None and (rw.is_stacked(mask) or rw.rank(mask) == r):
        full = rw.align(rw.expand(mask), r)  # (K, N or 1, ..., L, S)
        batch = rw.method("size", q, 1)
        mask = merge(rw.method("expand", full, rw.k, batch, *([-1] * (r - 1))))
    out = rw.fn(F.scaled_dot_product_attention, merge(q), merge(k), merge(v), mask, **rest)
    return rw.method("unflatten", out, 0, (rw.k, -1)), True


# -- losses -----------------------------------------------------------------------------------------

def _class_loss(rw, fn, x, target, weight, ignore_index, reduction, label_smoothing):
    if not rw.is_stacked(x) or rw.is_stacked(weight):
        rw.fail("a loss whose predictions all models share, or with per-model class weights")
    extra = {"label_smoothing": label_smoothing} if label_smoothing is not None else {}
    return rw.fn(fn, x, target, rw.k, rw.is_stacked(target), rw.rank(x) == 1, weight, ignore_index, reduction,
                 **extra)


def _elementwise_loss(rw, fn, x, target, reduction, extra):
    x, target = rw.expand(x), rw.align(target, rw.rank(x))
    return rw.fn(losses.elementwise_loss, fn.__name__, x, target, rw.k, reduction, **extra)


def f_cross_entropy(rw, n, args, kwargs):
    names = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction", "label_smoothing")
    defaults = (None, None, None, None, -100, None, "mean", 0.0)
    x, t, w, sa, ii, red, reduction, ls = (arg(args, kwargs, i, k, d) for i, (k, d) in enumerate(zip(names, defaults)))
    if sa is not None or red is not None:
        rw.fail("the deprecated size_average/reduce arguments")
    return _class_loss(rw, losses.cross_entropy, x, t, w, ii, reduction, ls), True


def f_nll_loss(rw, n, args, kwargs):
    names = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction")
    defaults = (None, None, None, None, -100, None, "mean")
    x, t, w, sa, ii, red, reduction = (arg(args, kwargs, i, k, d) for i, (k, d) in enumerate(zip(names, defaults)))
    if sa is not None or red is not None:
        rw.fail("the deprecated size_average/reduce arguments")
    return _class_loss(rw, losses.nll_loss, x, t, w, ii, reduction, None), True


def _elementwise(fn):
    def rule(rw, n, args, kwargs):
        x, t = arg(args, kwargs, 0, "input"), arg(args, kwargs, 1, "target")
        kw = {k: v for k, v in kwargs.items() if k not in ("input", "target", "reduction", "size_average", "reduce")}
        if kwargs.get("size_average") is not None or kwargs.get("reduce") is not None or len(args) > 2:
            rw.fail(f"{fn.__name__} with positional options or the deprecated size_average/reduce")
        return _elementwise_loss(rw, fn, x, t, kwargs.get("reduction", "mean"), kw), True
    return rule


FUNCTIONAL = {
    "linear": f_linear, "conv1d": f_conv, "conv2d": f_conv, "conv3d": f_conv, "layer_norm": f_layer_norm,
    "batch_norm": f_batch_norm, "embedding": f_embedding, "scaled_dot_product_attention": f_attention,
    "cross_entropy": f_cross_entropy, "nll_loss": f_nll_loss,
    **{name: f_channels for name in ("max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d",
                                     "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
                                     "adaptive_max_pool1d", "adaptive_max_pool2d", "interpolate", "dropout2d")},
    **{fn.__name__: _elementwise(fn) for fn in (F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss,
                                                F.binary_cross_entropy, F.binary_cross_entropy_with_logits)},
}
