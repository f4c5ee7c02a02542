"""How each op reading a stacked value is rewritten (torch functions and Tensor methods).

Pointwise ops are kept, their stacked operands aligned for broadcasting; ops that take a dim get
it moved past the K dim; shapes read off a stacked tensor drop the K dim, and shapes written to
one get it back; indexing keeps the K dim whole; matmul aligns batch dims. Layers with state
and losses are in ``nn_rules``. An op with no rule here fails with a one-line ``TraceError``.
"""

from __future__ import annotations

import builtins
import operator
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

from autopar.fusion import nn_rules
from autopar.fusion.rewrite import Rewriter, arg as _get, with_arg as _set

UNARY = ("relu relu_ gelu silu sigmoid tanh exp log log1p log2 sqrt rsqrt abs neg erf sin cos leaky_relu elu selu "
         "celu hardtanh relu6 softplus mish hardswish hardsigmoid logical_not bitwise_not reciprocal square clamp "
         "clip clamp_min clamp_max sign floor ceil round trunc logsigmoid softsign tanhshrink dropout alpha_dropout "
         "nan_to_num zeros_like ones_like full_like empty_like rand_like randn_like contiguous clone detach "
         "float double half bfloat16 long int bool to type_as tril triu isnan isinf isfinite").split()
BINARY = ("add sub mul div true_divide floor_divide pow maximum minimum eq ne lt le gt ge logical_and logical_or "
          "logical_xor bitwise_and bitwise_or bitwise_xor where masked_fill remainder fmod rsub lerp addcmul "
          "addcdiv atan2 hypot copysign").split()
OPERATORS = (operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.pow,
             operator.neg, operator.pos, operator.invert, operator.eq, operator.ne, operator.lt, operator.le,
             operator.gt, operator.ge, operator.and_, operator.or_, operator.xor, operator.mod, operator.abs,
             operator.iadd, operator.isub, operator.imul, operator.itruediv)
# reductions over a dim (int or tuple); None = every dim, which here means every dim but K
REDUCTIONS = "sum mean amax amin prod std var logsumexp argmax argmin max min all any count_nonzero nansum nanmean".split()
TUPLE_DIMS = set("sum mean amax amin std var logsumexp all any count_nonzero nansum nanmean".split())
SCANS = "cumsum cumprod cummax cummin softmax log_softmax normalize topk sort argsort index_select".split()


def _name(n: fx.Node) -> str:
    return n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))


def _emit(rw: Rewriter, n: fx.Node, args, kwargs) -> fx.Node:
    return rw.graph.create_node(n.op, n.target, tuple(args), dict(kwargs))


def _static(rw: Rewriter, d):
    if isinstance(d, fx.Node):
        rw.fail("a dim computed at run time")
    return d


def _shift(rw: Rewriter, d, rank: int):
    d = _static(rw, d)
    if isinstance(d, (tuple, list)):
        return type(d)(rw.dim(x, rank) for x in d)
    return rw.dim(d, rank)


# -- pointwise ---------------------------------------------------------------------------------

def pointwise(rw: Rewriter, n, args, kwargs):
    values = [*args, *kwargs.values()]
    top = max((rw.rank(v) for v in values if rw.is_tensor(v)), default=0)
    inplace = n.op == "call_method" and n.target.endswith("_") and not n.target.startswith("__")
    inplace = inplace or n.target in (operator.iadd, operator.isub, operator.imul, operator.itruediv)
    if args and not rw.is_stacked(args[0]) and rw.is_tensor(args[0]) and (n.op == "call_method" or inplace):
        if inplace:
            rw.fail("an in-place update of a value all models share with a per-model value")
        args = (rw.expand(args[0]),) + tuple(args[1:])  # the method's result takes its self's shape
    first = 1 if inplace else 0
    args = tuple(a if i < first else rw.align(a, top) for i, a in enumerate(args))
    kwargs = {k: rw.align(v, top) for k, v in kwargs.items()}
    return _emit(rw, n, args, kwargs), True


# -- dims ----------------------------------------------------------------------------------------

def reduction(rw: Rewriter, n, args, kwargs):
    name, x = _name(n), args[0]
    if name in ("max", "min") and rw.is_tensor(_get(args, kwargs, 1, "other")):
        return pointwise(rw, n, args, kwargs)
    r = rw.rank(x)
    dim = _get(args, kwargs, 1, "dim")
    if name in ("amax", "amin") and dim == ():
        dim = None
    if dim is not None:
        args, kwargs = _set(args, kwargs, 1, "dim", _shift(rw, dim, r))
        return _emit(rw, n, args, kwargs), True
    if r == 0:
        rw.fail(f"{name} of a 0-d value")
    if name in TUPLE_DIMS:
        args, kwargs = _set(args, kwargs, 1, "dim", tuple(range(1, r + 1)))
        return _emit(rw, n, args, kwargs), True
    flat = rw.method("flatten", x, 1)  # one dim for each model, reduced on its own
    out = _emit(rw, n, (flat,) + tuple(args[1:]), {**kwargs, "dim": 1})
    if name in ("max", "min"):  # the dim form also returns indices
        out = rw.fn(operator.getitem, out, 0)
    return out, True


def scan(rw: Rewriter, n, args, kwargs):
    """softmax, cumsum, topk, normalize, ...: one dim argument (position 1, or 2 for normalize)."""
    name = _name(n)
    pos, default = {"normalize": (2, 1), "topk": (2, -1), "sort": (1, -1), "argsort": (1, -1)}.get(name, (1, None))
    d = _get(args, kwargs, pos, "dim", default)
    if d is None:
        rw.fail(f"{name} without a dim")
    if name == "index_select":
        args = (args[0], rw.dim(_static(rw, d), rw.rank(args[0]))) + tuple(args[2:])
        return _emit(rw, n, args, kwargs), True
    args, kwargs = _set(args, kwargs, pos, "dim", rw.dim(_static(rw, d), rw.rank(args[0])))
    return _emit(rw, n, args, kwargs), True


def transpose(rw: Rewriter, n, args, kwargs):
    r = rw.rank(args[0])
    d0, d1 = _get(args, kwargs, 1, "dim0"), _get(args, kwargs, 2, "dim1")
    return rw.method("transpose", args[0], rw.dim(_static(rw, d0), r), rw.dim(_static(rw, d1), r)), True


def permute(rw: Rewriter, n, args, kwargs):
    dims = args[1:] if len(args) > 1 else (kwargs.get("dims"),)
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = dims[0]
    r = rw.rank(args[0])
    return rw.method("permute", args[0], (0,) + tuple(rw.dim(_static(rw, d), r) for d in dims)), True


def movedim(rw: Rewriter, n, args, kwargs):
    r = rw.rank(args[0])
    src, dst = _get(args, kwargs, 1, "source"), _get(args, kwargs, 2, "destination")
    return rw.fn(torch.movedim, args[0], _shift(rw, src, r), _shift(rw, dst, r)), True


def t(rw: Rewriter, n, args, kwargs):
    return (rw.method("transpose", args[0], 1, 2) if rw.rank(args[0]) == 2 else args[0]), True


def flatten(rw: Rewriter, n, args, kwargs):
    x, r = args[0], rw.rank(args[0])
    start, end = _get(args, kwargs, 1, "start_dim", 0), _get(args, kwargs, 2, "end_dim", -1)
    if r == 0:
        return rw.method("unsqueeze", x, 1), True
    return rw.method("flatten", x, rw.dim(_static(rw, start), r), rw.dim(_static(rw, end), r)), True


def unflatten(rw: Rewriter, n, args, kwargs):
    d, sizes = _get(args, kwargs, 1, "dim"), _get(args, kwargs, 2, "sizes")
    return rw.method("unflatten", args[0], rw.dim(_static(rw, d), rw.rank(args[0])), sizes), True


def unsqueeze(rw: Rewriter, n, args, kwargs):
    d = _get(args, kwargs, 1, "dim")
    return rw.method("unsqueeze", args[0], rw.dim(_static(rw, d), rw.rank(args[0]) + 1)), True


def squeeze(rw: Rewriter, n, args, kwargs):
    x, r = args[0], rw.rank(args[0])
    d = _get(args, kwargs, 1, "dim")
    if d is None:  # never the K dim, even when K == 1
        d = tuple(i for i, s in enumerate(rw.shape(x)) if s == 1)
        if not d:
            return x, True
    return rw.method("squeeze", x, _shift(rw, d, r)), True


def split(rw: Rewriter, n, args, kwargs):
    name = _name(n)
    pos = 1 if name == "unbind" else 2
    d = _get(args, kwargs, pos, "dim", 0)
    args, kwargs = _set(args, kwargs, pos, "dim", rw.dim(_static(rw, d), rw.rank(args[0])))
    return _emit(rw, n, args, kwargs), True


def narrow(rw: Rewriter, n, args, kwargs):
    d = _get(args, kwargs, 1, "dim")
    args, kwargs = _set(args, kwargs, 1, "dim", rw.dim(_static(rw, d), rw.rank(args[0])))
    return _emit(rw, n, args, kwargs), True


def gather(rw: Rewriter, n, args, kwargs):
    x, d, index = args[0], _get(args, kwargs, 1, "dim"), _get(args, kwargs, 2, "index")
    return rw.fn(torch.gather, rw.expand(x), rw.dim(_static(rw, d), rw.rank(x)), rw.expand(index)), True


def cat(rw: Rewriter, n, args, kwargs):
    tensors = _get(args, kwargs, 0, "tensors")
    d = _get(args, kwargs, 1, "dim", 0)
    r = max(rw.rank(x) for x in tensors)
    out_rank = r + 1 if _name(n) == "stack" else r
    tensors = [rw.expand(x) for x in tensors]
    return rw.fn(n.target, tensors, rw.dim(_static(rw, d), out_rank)), True


# -- shapes --------------------------------------------------------------------------------------

def _sizes(rw: Rewriter, rest: tuple, lead: tuple):
    """A view/expand/repeat size list with ``lead`` prepended (a literal, or a node for a Size)."""
    if len(rest) == 1 and isinstance(rest[0], (tuple, list)):
        rest = tuple(rest[0])
    if len(rest) == 1 and isinstance(rest[0], fx.Node):  # x.view(y.shape): (K,) + that Size
        return (rw.fn(operator.add, lead, rw.fn(builtins.tuple, rest[0])),)
    return lead + tuple(rest)


def reshape(rw: Rewriter, n, args, kwargs):
    rest = tuple(args[1:]) or (kwargs.get("shape") or kwargs.get("size"),)
    if any(isinstance(a, torch.dtype) for a in rest):
        rw.fail("a view to another dtype")
    return rw.method("reshape", args[0], *_sizes(rw, rest, (rw.k,))), True


def expand(rw: Rewriter, n, args, kwargs):
    rest = tuple(args[1:]) or (kwargs.get("size"),)
    sizes = _sizes(rw, rest, (rw.k,))
    x = rw.align(args[0], rw.rank(rw.values.get(n)))  # expand may add leading dims
    return rw.method("expand", x, *sizes), True


def repeat(rw: Rewriter, n, args, kwargs):
    rest = tuple(args[1:])
    if len(rest) == 1 and isinstance(rest[0], (tuple, list)):
        rest = tuple(rest[0])
    if len(rest) == 1 and isinstance(rest[0], fx.Node):
        rw.fail("repeat with a size computed at run time")
    x = rw.align(args[0], len(rest))
    return rw.method("repeat", x, 1, *rest), True


def as_other(rw: Rewriter, n, args, kwargs):
    """view_as / reshape_as / expand_as."""
    x, other = args[0], args[1]
    kind = _name(n).split("_")[0]
    if rw.is_stacked(other):
        x = rw.align(x, rw.rank(other)) if kind == "expand" else rw.expand(x)
        return rw.method(f"{kind if kind != 'view' else 'reshape'}_as", x, other), True
    size = rw.fn(operator.add, (rw.k,), rw.fn(builtins.tuple, rw.fn(builtins.getattr, other, "shape")))
    if kind == "expand":
        return rw.method("expand", rw.align(x, rw.rank(other)), size), True
    return rw.method("reshape", x, size), True


def size(rw: Rewriter, n, args, kwargs):
    x, r = args[0], rw.rank(args[0])
    d = _get(args, kwargs, 1, "dim")
    if d is None:
        return rw.fn(operator.getitem, rw.method("size", x), slice(1, None)), False
    return rw.method("size", x, rw.dim(_static(rw, d), r)), False


def attribute(rw: Rewriter, n, args, kwargs):
    x, attr = args
    r = rw.rank(x)
    if attr == "shape":
        return rw.fn(operator.getitem, rw.fn(builtins.getattr, x, "shape"), slice(1, None)), False
    if attr == "ndim":
        return r, False
    if attr == "T":
        return (rw.method("permute", x, (0,) + tuple(range(r, 0, -1)))), True
    if attr in ("mT", "data"):
        return rw.fn(builtins.getattr, x, attr), True
    if attr in ("dtype", "device", "requires_grad", "is_cuda", "layout"):
        return rw.fn(builtins.getattr, x, attr), False
    rw.fail(f"the attribute {attr!r}")


def dim(rw: Rewriter, n, args, kwargs):
    return rw.rank(args[0]), False


def numel(rw: Rewriter, n, args, kwargs):
    return rw.fn(operator.floordiv, rw.method("numel", args[0]), rw.k), False


# -- indexing and matmul ----------------------------------------------------------------------------

def getitem(rw: Rewriter, n, args, kwargs):
    x, index = args
    if not rw.is_tensor(x):  # an element of a tuple of stacked values (split's parts)
        return rw.fn(operator.getitem, x, index), rw.is_stacked(x)
    if not rw.is_stacked(x) or rw.is_stacked(index):
        rw.fail("indexing with per-model indices")
    index = index if isinstance(index, tuple) else (index,)
    advanced = [i for i, v in enumerate(index) if rw.is_tensor(v) or isinstance(v, (list, fx.Node))]
    if advanced and advanced != list(range(advanced[0], advanced[-1] + 1)):
        rw.fail("advanced indices separated by slices (they would move to the front)")
    return rw.fn(operator.getitem, x, (slice(None),) + index), True


def matmul(rw: Rewriter, n, args, kwargs):
    a, b = args[0], _get(args, kwargs, 1, "other", _get(args, kwargs, 1, "mat2"))
    ra, rb = rw.rank(a), rw.rank(b)
    squeeze = None
    matrix = torch.empty((1, 1), device="meta")  # what a vector made a one-row matrix stands for
    if rw.is_stacked(a) and ra == 1:
        a, ra, squeeze = rw.mark(rw.method("unsqueeze", a, -2), matrix), 2, -2
    if rw.is_stacked(b) and rb == 1:
        b, rb, squeeze = rw.mark(rw.method("unsqueeze", b, -1), matrix), 2, -1
    top = max(ra, rb)
    a, b = rw.align(a, top), rw.align(b, top)
    out = rw.fn(torch.matmul, a, b)
    return (rw.method("squeeze", out, squeeze) if squeeze is not None else out), True


def einsum(rw: Rewriter, n, args, kwargs):
    eq, operands = args[0], list(args[1:])
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = list(operands[0])
    if "..." in eq or "->" not in eq:
        rw.fail("einsum without an explicit output ('->') or with '...'")
    lhs, out = eq.replace(" ", "").split("->")
    k = next(c for c in "KZYXWVUTSRQPONMLJIHGFEDCBAzyxwvutsrqponmlkjihgfedcba" if c not in eq)
    terms = [k + t if rw.is_stacked(x) else t for t, x in zip(lhs.split(","), operands)]
    return rw.fn(torch.einsum, ",".join(terms) + "->" + k + out, *operands), True


# -- the tables --------------------------------------------------------------------------------------

def _table() -> tuple[dict, dict]:
    by_name: dict[str, Any] = {}
    for name in UNARY + BINARY:
        by_name[name] = pointwise
        by_name[name + "_"] = pointwise
    for name in REDUCTIONS:
        by_name[name] = reduction
    for name in SCANS:
        by_name[name] = scan
    by_name.update(transpose=transpose, swapaxes=transpose, swapdims=transpose, permute=permute, movedim=movedim,
                   moveaxis=movedim, t=t, flatten=flatten, unflatten=unflatten, unsqueeze=unsqueeze,
                   squeeze=squeeze, split=split, chunk=split, unbind=split, tensor_split=split,
                   split_with_sizes=split, narrow=narrow, select=narrow, gather=gather, cat=cat, concat=cat,
                   concatenate=cat, stack=cat, view=reshape, reshape=reshape, expand=expand, repeat=repeat,
                   view_as=as_other, reshape_as=as_other, expand_as=as_other, size=size, dim=dim,
                   ndimension=dim, numel=numel, matmul=matmul, mm=matmul, bmm=matmul, einsum=einsum,
                   __matmul__=matmul, **nn_rules.FUNCTIONAL)
    methods = dict(by_name)
    functions: dict[Any, Any] = {}
    for mod in (torch, F):
        for name, rule in by_name.items():
            f = getattr(mod, name, None)
            if callable(f):
                functions.setdefault(f, rule)
    for op in OPERATORS:
        functions[op] = pointwise
    functions[operator.matmul] = matmul
    functions[operator.getitem] = getitem
    functions[builtins.getattr] = attribute
    return functions, methods


FUNCTIONS, METHODS = _table()


def call_rule(rw: Rewriter, n: fx.Node, args, kwargs):
    rule = METHODS.get(n.target) if n.op == "call_method" else FUNCTIONS.get(n.target)
    if rule is None:
        rw.fail(f"{_name(n)} has no fusion rule")
    return rule(rw, n, tuple(args), dict(kwargs))
