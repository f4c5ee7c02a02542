"""Call sites -> rules: what a model calls, which rule prices it, and how its arguments bind.

Four tables, one per way a call reaches a traced graph: ``torch``/``F``/``operator`` functions,
Tensor methods, ``nn.Module`` leaves (turned into their functional form, parameters as
``param:<path>`` tensors), and aten ops from the torch.export front end. A rule sees the same
argument names whichever site it came from.
"""

from __future__ import annotations

import importlib
import inspect
import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn

from autopar.frontend.rules.base import Tensor, signature
from autopar.frontend.rules.moe import expert_list, experts_call, is_experts


@dataclass(frozen=True)
class Site:
    op: str  # rule name in autopar.frontend.rules.RULES
    sig: inspect.Signature
    target: str  # display name for Node.target
    fixed: dict[str, Any] = field(default_factory=dict)
    rename: dict[str, str] = field(default_factory=dict)  # site arg name -> rule arg name

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        bound = self.sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return {self.rename.get(k, k): v for k, v in bound.arguments.items()}


ANY = "*args, **kwargs"
LINEAR = "input, weight, bias=None"
MATMUL = "input, other"
ADDMM = "bias, input, other, *, beta=1, alpha=1"
CONV = "input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1"
SOFTMAX = "input, dim=None, _stacklevel=3, dtype=None"
REDUCE = "input, dim=None, keepdim=False, *, dtype=None"
MAXPOOL = "input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False"
AVGPOOL = "input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None"
ADAPTIVE = "input, output_size, return_indices=False"
SDPA = "query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False"
CE = ("input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction='mean', "
      "label_smoothing=0.0")

EXPERTS = "hidden, top_k_index, top_k_weights, *weights, module='', experts=0"
FACTORY = "creates a new tensor (factory op); made whole on every device (replicated)"

UNARY = ("relu gelu silu sigmoid tanh exp log log1p sqrt rsqrt abs neg erf sin cos leaky_relu elu selu celu "
         "hardtanh relu6 softplus mish hardswish hardsigmoid logical_not bitwise_not reciprocal square clamp clip "
         "sign floor ceil round logsigmoid softsign tanhshrink").split()
BINARY = ("add sub mul div true_divide floor_divide pow maximum minimum eq ne lt le gt ge logical_and logical_or "
          "bitwise_and bitwise_or bitwise_xor where masked_fill remainder fmod rsub").split()
OPERATORS = {"add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "floordiv": "floor_divide",
             "pow": "pow", "neg": "neg", "invert": "bitwise_not", "eq": "eq", "ne": "ne", "lt": "lt", "le": "le",
             "gt": "gt", "ge": "ge", "and_": "bitwise_and", "or_": "bitwise_or", "xor": "bitwise_xor",
             "mod": "remainder", "iadd": "add", "isub": "sub", "imul": "mul", "itruediv": "div", "pos": "identity"}

# (rule, signature, fixed, rename) per function-like name; shared by torch.*, F.*, methods and aten
COMMON: dict[str, tuple] = {
    "linear": ("linear", LINEAR, {}),
    "matmul": ("matmul", MATMUL, {}), "mm": ("matmul", MATMUL, {}), "bmm": ("matmul", MATMUL, {}),
    "addmm": ("matmul", ADDMM, {}), "baddbmm": ("matmul", ADDMM, {}),
    "einsum": ("einsum", "equation, *operands", {}),
    "conv1d": ("conv", CONV, {}), "conv2d": ("conv", CONV, {}),
    "embedding": ("embedding", "input, weight, padding_idx=None, max_norm=None, norm_type=2.0, "
                  "scale_grad_by_freq=False, sparse=False", {}),
    "layer_norm": ("layer_norm", "input, normalized_shape, weight=None, bias=None, eps=1e-05", {}),
    "batch_norm": ("batch_norm", "input, running_mean, running_var, weight=None, bias=None, training=False, "
                   "momentum=0.1, eps=1e-05", {}),
    "softmax": ("softmax", SOFTMAX, {"kind": "softmax"}),
    "log_softmax": ("softmax", SOFTMAX, {"kind": "log_softmax"}),
    "scaled_dot_product_attention": ("sdpa", SDPA, {}),
    "dropout": ("dropout", "input, p=0.5, training=True, inplace=False", {}),
    "dropout1d": ("dropout", "input, p=0.5, training=True, inplace=False", {}),
    "dropout2d": ("dropout", "input, p=0.5, training=True, inplace=False", {}),
    "sum": ("reduce", REDUCE, {"fn": "sum"}), "mean": ("reduce", REDUCE, {"fn": "mean"}),
    "amax": ("reduce", REDUCE, {"fn": "amax"}), "amin": ("reduce", REDUCE, {"fn": "amin"}),
    "view": ("view", "input, *args, **kwargs", {}), "reshape": ("view", "input, *args, **kwargs", {}),
    "flatten": ("view", "input, *args, **kwargs", {}), "unflatten": ("view", "input, *args, **kwargs", {}),
    "squeeze": ("view", "input, *args, **kwargs", {}), "unsqueeze": ("view", "input, *args, **kwargs", {}),
    "view_as": ("view", "input, other", {}), "reshape_as": ("view", "input, other", {}),
    "expand": ("elementwise", "input, *sizes", {"fn": "expand"}),
    "expand_as": ("elementwise", "input, other", {"fn": "expand"}),
    "transpose": ("permute", "input, dim0, dim1", {"kind": "transpose"}),
    "swapaxes": ("permute", "input, dim0, dim1", {"kind": "transpose"}),
    "swapdims": ("permute", "input, dim0, dim1", {"kind": "transpose"}),
    "permute": ("permute", "input, *dims", {"kind": "permute"}),
    "t": ("permute", "input", {"kind": "t"}),
    "contiguous": ("identity", ANY, {"fn": "contiguous"}), "clone": ("identity", ANY, {"fn": "clone"}),
    "detach": ("identity", ANY, {"fn": "detach"}), "to": ("identity", ANY, {"fn": "to"}),
    "type_as": ("identity", ANY, {"fn": "type_as"}), "float": ("identity", ANY, {"fn": "float"}),
    "half": ("identity", ANY, {"fn": "half"}), "bfloat16": ("identity", ANY, {"fn": "bfloat16"}),
    "double": ("identity", ANY, {"fn": "double"}), "long": ("identity", ANY, {"fn": "long"}),
    "int": ("identity", ANY, {"fn": "int"}), "bool": ("identity", ANY, {"fn": "bool"}),
    "type": ("identity", ANY, {"fn": "type"}), "alias": ("identity", ANY, {"fn": "alias"}),
    "cat": ("cat", "tensors, dim=0", {}), "concat": ("cat", "tensors, dim=0", {}),
    "concatenate": ("cat", "tensors, dim=0", {}), "stack": ("stack", "tensors, dim=0", {}),
    "split": ("split", "input, split_size_or_sections, dim=0", {}),
    "split_with_sizes": ("split", "input, split_sizes, dim=0", {}),
    "chunk": ("split", "input, chunks, dim=0", {}),
    "unbind": ("split", "input, dim=0", {"kind": "unbind"}),
    "max_pool1d": ("pool", MAXPOOL, {"kind": "max", "ndim": 1}),
    "max_pool2d": ("pool", MAXPOOL, {"kind": "max", "ndim": 2}),
    "avg_pool1d": ("pool", AVGPOOL, {"kind": "avg", "ndim": 1}),
    "avg_pool2d": ("pool", AVGPOOL, {"kind": "avg", "ndim": 2}),
    "adaptive_avg_pool1d": ("pool", ADAPTIVE, {"kind": "avg", "ndim": 1, "adaptive": True}),
    "adaptive_avg_pool2d": ("pool", ADAPTIVE, {"kind": "avg", "ndim": 2, "adaptive": True}),
    "adaptive_max_pool1d": ("pool", ADAPTIVE, {"kind": "max", "ndim": 1, "adaptive": True}),
    "adaptive_max_pool2d": ("pool", ADAPTIVE, {"kind": "max", "ndim": 2, "adaptive": True}),
    "cross_entropy": ("cross_entropy", CE, {}),
    **{n: ("elementwise", ANY, {"fn": n}) for n in UNARY + BINARY},
    # reductions whose partial results do not add up (the reduced dims are unsplittable)
    **{n: ("reduce", REDUCE + ", **kwargs", {"fn": n}) for n in ("max", "min", "argmax", "argmin", "any", "all",
                                                                 "logsumexp", "var", "std", "prod")},
    "cumsum": ("scan", "input, dim, *, dtype=None", {"fn": "cumsum"}),
    "cumprod": ("scan", "input, dim, *, dtype=None", {"fn": "cumprod"}),
    "gather": ("gather", "input, dim, index, *, sparse_grad=False", {}),
    "index_select": ("index_select", "input, dim, index", {}),
    "pad": ("pad", "input, pad, mode='constant', value=None", {}),
    "triu": ("positional", "input, diagonal=0", {"fn": "triu"}),
    "tril": ("positional", "input, diagonal=0", {"fn": "tril"}),
    "rms_norm": ("layer_norm", "input, normalized_shape, weight=None, eps=None", {"kind": "rms_norm"}),
    "narrow": ("slice", "input, dim, start, length", {"kind": "narrow"}),
    # a new tensor shaped like an operand: laid out like it, element by element
    **{n: ("elementwise", ANY, {"fn": n}) for n in ("zeros_like", "ones_like", "full_like", "empty_like",
                                                    "rand_like", "randn_like", "bernoulli")},
    # a new tensor of a given size, whatever the operand: made whole on every device
    **{n: ("opaque", ANY, {"reason": FACTORY}) for n in ("new_ones", "new_zeros", "new_full", "new_empty",
                                                         "new_tensor", "scalar_tensor")},
}

# aten spellings that differ from torch's: name -> (rule, signature, fixed, rename)
ATEN_ONLY: dict[str, tuple] = {
    "embedding": ("embedding", "weight, input, padding_idx=-1, scale_grad_by_freq=False, sparse=False", {}),
    "layer_norm": ("layer_norm", "input, normalized_shape, weight=None, bias=None, eps=1e-05, cudnn_enable=True", {}),
    "batch_norm": ("batch_norm", "input, weight, bias, running_mean, running_var, training, momentum, eps, "
                   "cudnn_enabled=False", {}),
    "dropout": ("dropout", "input, p, training", {}),
    "einsum": ("einsum", "equation, operands, path=None", {}),
    "convolution": ("conv", "input, weight, bias, stride, padding, dilation, transposed, output_padding, groups", {}),
    "_unsafe_view": ("view", "input, *args, **kwargs", {}),
    "slice": ("slice", "input, dim=0, start=None, end=None, step=1", {"kind": "slice"}),
    "select": ("slice", "input, dim, index", {"kind": "select"}),
    "_softmax": ("softmax", "input, dim, half_to_float=False", {"kind": "softmax"}),
    "_log_softmax": ("softmax", "input, dim, half_to_float=False", {"kind": "log_softmax"}),
    "softmax": ("softmax", "input, dim, dtype=None", {"kind": "softmax"}),
    "log_softmax": ("softmax", "input, dim, dtype=None", {"kind": "log_softmax"}),
    "split": ("split", "input, split_size, dim=0", {}),
    "max_pool2d_with_indices": ("pool", MAXPOOL[: MAXPOOL.rindex(",")], {"kind": "max", "ndim": 2}),
    "_adaptive_avg_pool2d": ("pool", ADAPTIVE, {"kind": "avg", "ndim": 2, "adaptive": True}),
    "cross_entropy_loss": ("cross_entropy", "input, target, weight=None, reduction=1, ignore_index=-100, "
                           "label_smoothing=0.0", {}),
    "lstm": ("lstm", "input, hx, weights, has_biases, num_layers, dropout, train, bidirectional, batch_first", {}),
    "_to_copy": ("identity", ANY, {"fn": "to"}),
    "lift_fresh_copy": ("identity", ANY, {"fn": "clone"}),
    "detach_": ("identity", ANY, {"fn": "detach"}),
    "index": ("index", "input, indices", {}),
    "constant_pad_nd": ("pad", "input, pad, value=0", {}),
    "__and__": ("elementwise", ANY, {"fn": "bitwise_and"}), "__or__": ("elementwise", ANY, {"fn": "bitwise_or"}),
    "__xor__": ("elementwise", ANY, {"fn": "bitwise_xor"}),
    "clamp_min": ("elementwise", ANY, {"fn": "clamp_min"}), "clamp_max": ("elementwise", ANY, {"fn": "clamp_max"}),
    # in-place forms: the same split as the op (ResNet's ``hidden += residual``)
    **{f"{n}_": ("elementwise", ANY, {"fn": n}) for n in UNARY + BINARY + ["copy", "fill", "zero", "clamp_min",
                                                                         "clamp_max"]},
}



def _family_sites() -> dict[str, tuple]:
    """The call sites a family's rule module declares itself (its ``SITES``, as ``COMMON``'s); a
    name the tables here or another module already give is an error, not a silent override."""
    from autopar.frontend.rules import MODULES

    out: dict[str, tuple] = {}
    for module in MODULES.values():
        for name, entry in getattr(module, "SITES", {}).items():
            if name in COMMON or name in out:
                raise ValueError(f"{module.__name__}.SITES: the call {name!r} already has a site")
            out[name] = entry
    return out


COMMON.update(_family_sites())


def _site(name: str, entry: tuple, target: str) -> Site:
    op, sig, fixed = entry[:3]
    rename = entry[3] if len(entry) > 3 else {}
    return Site(op, signature(sig), target, dict(fixed), dict(rename))


def _functions() -> dict[Callable, Site]:
    table: dict[Callable, Site] = {}
    for mod_name in ("torch", "torch.nn.functional"):
        mod = importlib.import_module(mod_name)
        for name, entry in COMMON.items():
            fn = getattr(mod, name, None)
            if mod_name == "torch" and name in ("embedding", "batch_norm"):  # aten's argument order
                entry = ATEN_ONLY[name]
            if callable(fn) and not isinstance(fn, torch.dtype) and fn not in table:
                table[fn] = _site(name, entry, f"{mod_name}.{name}")
    for name, base in OPERATORS.items():
        entry = ("identity", ANY, {"fn": "identity"}) if base == "identity" else ("elementwise", ANY, {"fn": base})
        table[getattr(operator, name)] = _site(name, entry, f"operator.{name}")
    table[operator.matmul] = _site("matmul", COMMON["matmul"], "operator.matmul")
    table[operator.getitem] = Site("slice", signature("input, index"), "operator.getitem")
    table[experts_call] = Site("moe_experts", signature(EXPERTS), "experts")
    return table


def _methods() -> dict[str, Site]:
    table = {name: _site(name, entry, f"Tensor.{name}") for name, entry in COMMON.items()}
    for name in UNARY + BINARY + ["add", "sub", "mul", "div", "masked_fill", "relu", "clamp", "copy", "zero",
                                  "fill", "sigmoid", "tanh", "exp", "pow", "neg"]:
        table[f"{name}_"] = _site(name, ("elementwise", ANY, {"fn": name}), f"Tensor.{name}_")
    table["__matmul__"] = table["matmul"]
    table["softmax"] = _site("softmax", ("softmax", "input, dim, dtype=None", {"kind": "softmax"}), "Tensor.softmax")
    table["log_softmax"] = _site("log_softmax", ("softmax", "input, dim, dtype=None", {"kind": "log_softmax"}),
                                 "Tensor.log_softmax")
    return table


def _aten() -> dict[Any, Site]:
    table: dict[Any, Site] = {}
    for name, entry in {**COMMON, **ATEN_ONLY}.items():
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None:
            table[packet] = _site(name, entry, f"aten.{name}")
    return table


FUNCTIONS = _functions()
METHODS = _methods()
ATEN = _aten()

# getattr(x, name) on a tensor that yields a tensor
ATTRIBUTES = {
    "T": Site("permute", signature("input"), "Tensor.T", {"kind": "T"}),
    "mT": Site("permute", signature("input"), "Tensor.mT", {"kind": "mT"}),
    "data": Site("identity", signature("input"), "Tensor.data", {"fn": "alias"}),
}


@dataclass
class ModuleCall:
    """A call_module node in functional form: the site to apply and its bound arguments."""

    site: Site
    args: dict[str, Any]


def _adapt_module(m: nn.Module, x: list, kwargs: dict, param: Callable[[str], Tensor | None]) -> ModuleCall | None:
    """The functional form of a leaf module's call, or None where autopar has no rule for it."""
    def site(op, target, **fixed):
        return Site(op, signature(ANY), target, fixed)

    t = type(m)
    name = f"torch.nn.{t.__name__}"
    first = x[0] if x else kwargs.get("input")
    if isinstance(m, nn.Linear):
        return ModuleCall(site("linear", name), {"input": first, "weight": param("weight"), "bias": param("bias")})
    if isinstance(m, (nn.Conv1d, nn.Conv2d)):
        return ModuleCall(site("conv", name, padding_mode=m.padding_mode),
                          {"input": first, "weight": param("weight"), "bias": param("bias"), "stride": m.stride,
                           "padding": m.padding, "dilation": m.dilation, "groups": m.groups})
    if isinstance(m, nn.Embedding):
        return ModuleCall(site("embedding", name), {"input": first, "weight": param("weight"),
                                                    "padding_idx": m.padding_idx, "max_norm": m.max_norm})
    if isinstance(m, nn.LayerNorm):
        return ModuleCall(site("layer_norm", name), {"input": first, "normalized_shape": m.normalized_shape,
                                                     "weight": param("weight"), "bias": param("bias"), "eps": m.eps})
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        training = m.training or m.running_mean is None
        return ModuleCall(site("batch_norm", name), {
            "input": first, "weight": param("weight"), "bias": param("bias"), "running_mean": param("running_mean"),
            "running_var": param("running_var"), "training": training, "momentum": m.momentum, "eps": m.eps})
    if isinstance(m, (nn.Dropout, nn.Dropout1d, nn.Dropout2d)):
        return ModuleCall(site("dropout", name), {"input": first, "p": m.p, "training": m.training})
    if isinstance(m, nn.Identity):
        return ModuleCall(site("identity", name, fn="identity"), {"input": first})
    if isinstance(m, (nn.Softmax, nn.LogSoftmax)):
        kind = "softmax" if isinstance(m, nn.Softmax) else "log_softmax"
        return ModuleCall(site("softmax", name, kind=kind), {"input": first, "dim": m.dim})
    if isinstance(m, (nn.Flatten, nn.Unflatten)):
        return ModuleCall(site("view", name), {"input": first})
    if isinstance(m, (nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d)):
        kind = "max" if isinstance(m, (nn.MaxPool1d, nn.MaxPool2d)) else "avg"
        nd = 1 if isinstance(m, (nn.MaxPool1d, nn.AvgPool1d)) else 2
        args = {"input": first, "kernel_size": m.kernel_size, "stride": m.stride, "padding": m.padding,
                "ceil_mode": m.ceil_mode}
        args.update({"dilation": m.dilation} if kind == "max" else {"count_include_pad": m.count_include_pad})
        return ModuleCall(site("pool", name, kind=kind, ndim=nd), args)
    adaptive = (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d)
    if isinstance(m, adaptive):
        kind = "avg" if isinstance(m, (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)) else "max"
        nd = 1 if isinstance(m, (nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d)) else 2
        return ModuleCall(site("pool", name, kind=kind, ndim=nd, adaptive=True),
                          {"input": first, "output_size": m.output_size})
    if isinstance(m, nn.LSTM) and not m.proj_size:
        return ModuleCall(site("lstm", name, hidden=m.hidden_size, layers=m.num_layers, batch_first=m.batch_first,
                               bidirectional=m.bidirectional, bias=m.bias, dropout=m.dropout),
                          {"input": first, "hx": x[1] if len(x) > 1 else kwargs.get("hx"),
                           "weights": [param(n) for n in m._flat_weights_names]})
    if isinstance(m, (nn.GRU, nn.RNN)) and m.dropout == 0:  # dropout between layers: random, not described
        extra = {"nonlinearity": m.nonlinearity} if isinstance(m, nn.RNN) else {}
        return ModuleCall(site("gru" if isinstance(m, nn.GRU) else "rnn", name, hidden=m.hidden_size,
                               layers=m.num_layers, batch_first=m.batch_first, bidirectional=m.bidirectional,
                               bias=m.bias, **extra),
                          {"input": first, "hx": x[1] if len(x) > 1 else kwargs.get("hx"),
                           "weights": [param(n) for n in m._flat_weights_names]})
    if isinstance(m, nn.MultiheadAttention) and m._qkv_same_embed_dim and m.bias_k is None \
            and not m.add_zero_attn:
        def arg(i: int, key: str, default=None):
            return x[i] if len(x) > i else kwargs.get(key, default)

        return ModuleCall(site("mha", name, heads=m.num_heads, batch_first=m.batch_first),
                          {"query": first if first is not None else kwargs.get("query"),
                           "key": arg(1, "key"), "value": arg(2, "value"),
                           "key_padding_mask": arg(3, "key_padding_mask"), "attn_mask": arg(5, "attn_mask"),
                           "weights": [param("in_proj_weight"), param("in_proj_bias"),
                                       param("out_proj.weight"), param("out_proj.bias")]})
    if is_experts(m):
        listed = expert_list(m) is not None
        return ModuleCall(site("moe_experts", name), {
            "hidden": first, "top_k_index": x[1] if len(x) > 1 else kwargs.get("top_k_index"),
            "top_k_weights": x[2] if len(x) > 2 else kwargs.get("top_k_weights"),
            "weights": [param(n) for n, _ in m.named_parameters()], "experts": m.num_experts if listed else None})
    if isinstance(m, nn.CrossEntropyLoss):
        return ModuleCall(site("cross_entropy", name), {
            "input": first, "target": x[1] if len(x) > 1 else kwargs.get("target"), "weight": param("weight"),
            "reduction": m.reduction, "ignore_index": m.ignore_index, "label_smoothing": m.label_smoothing})
    activation = {nn.ReLU: "relu", nn.GELU: "gelu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid", nn.SiLU: "silu",
                  nn.LeakyReLU: "leaky_relu", nn.ELU: "elu", nn.Softplus: "softplus", nn.Hardtanh: "hardtanh",
                  nn.ReLU6: "relu6", nn.Mish: "mish", nn.Hardswish: "hardswish"}
    fn = activation.get(t)
    if fn is not None:
        extra = {"approximate": m.approximate} if isinstance(m, nn.GELU) else {}
        if isinstance(m, nn.LeakyReLU):
            extra = {"negative_slope": m.negative_slope}
        return ModuleCall(site("elementwise", name, fn=fn), {"args": (first,), "kwargs": extra})
    return None


def module_call(m: nn.Module, x: list, kwargs: dict, param: Callable[[str], Tensor | None]) -> ModuleCall | None:
    """``param(name)`` gives the module's own parameter or buffer ``name`` as a Tensor (or None)."""
    return _adapt_module(m, x, kwargs, param)


def has_module_rule(m: nn.Module) -> bool:
    """Leaf modules for the fx tracer: exactly those a rule understands whole."""
    return _adapt_module(m, [None], {}, lambda _name: None) is not None
