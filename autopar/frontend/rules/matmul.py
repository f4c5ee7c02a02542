"""Contractions: linear, matmul (mm/bmm/@, addmm/baddbmm) and einsum.

FLOPs are 2 per multiply-add, the biases not counted, as ``torch.utils.flop_counter`` counts
``addmm``/``mm``/``bmm``. The contracted dim ``k`` is a reduction: splitting it leaves partial sums.
"""

from __future__ import annotations

import math
import string

from autopar.core.ir import Dim
from autopar.frontend.rules.base import Call, Result, Tensor, broadcast_axes, lead_names, names_axes


def linear(call: Call) -> Result:
    """``y[..., n] = sum_k x[..., k] * W[n, k] + b[n]``: leading axes, then ``n``, then ``k~``."""
    x, w, bias = call.args["input"], call.args["weight"], call.args.get("bias")
    lead = lead_names(x.ndim - 1)
    n_out = w.shape[0] if w.ndim == 2 else 1
    k = x.shape[-1]
    dims = [Dim(d, s) for d, s in zip(lead, x.shape[:-1])] + [Dim("k", k, reduction=True)]
    if w.ndim == 2:
        dims.insert(len(lead), Dim("n", n_out))
    reads = [(x, names_axes(lead + ["k"])), (w, names_axes(["n", "k"][2 - w.ndim:]))]
    if isinstance(bias, Tensor):
        reads.append((bias, names_axes(["n"][: bias.ndim])))
    out_names = lead + (["n"] if w.ndim == 2 else [])
    flops = 2 * math.prod(x.shape[:-1]) * n_out * k
    return Result("linear", dims, reads, [names_axes(out_names)], flops,
                  {"bias": isinstance(bias, Tensor), "in_features": k, "out_features": n_out})


def matmul(call: Call) -> Result:
    """``torch.matmul`` semantics: batch axes broadcast, 1-D operands lose their m or n axis.

    Batch dims are ``b``, ``b1``, ``b2``...; then ``m`` (rows of a), ``n`` (columns of b), ``k~``.
    An ``addmm``/``baddbmm`` bias (``bias`` arg) broadcasts onto the output like an elementwise add.
    """
    a, b = call.args["input"], call.args["other"]
    bias = call.args.get("bias")
    a_shape = a.shape if a.ndim > 1 else (1,) + a.shape
    b_shape = b.shape if b.ndim > 1 else b.shape + (1,)
    m, k = a_shape[-2:]
    n = b_shape[-1]
    batch = _broadcast(a_shape[:-2], b_shape[:-2])
    bnames = ["b", *(f"b{i}" for i in range(1, len(batch)))][: len(batch)]
    dims = [Dim(name, s) for name, s in zip(bnames, batch)]
    if a.ndim > 1:
        dims.append(Dim("m", m))
    if b.ndim > 1:
        dims.append(Dim("n", n))
    dims.append(Dim("k", k, reduction=True))
    a_axes = broadcast_axes(a.shape[:-2], batch, bnames) + ((("m",), ("k",)) if a.ndim > 1 else (("k",),))
    b_axes = broadcast_axes(b.shape[:-2], batch, bnames) + ((("k",), ("n",)) if b.ndim > 1 else (("k",),))
    out_names = bnames + (["m"] if a.ndim > 1 else []) + (["n"] if b.ndim > 1 else [])
    reads = [(a, a_axes), (b, b_axes)]
    if isinstance(bias, Tensor):
        out_shape = call.outs[0].shape
        reads.insert(0, (bias, broadcast_axes(bias.shape, out_shape, out_names)))
    flops = 2 * math.prod(batch) * m * n * k
    return Result("matmul", dims, reads, [names_axes(out_names)], flops, {"bias": isinstance(bias, Tensor)})


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    return tuple(max(x, y) for x, y in zip(a, b))


def einsum(call: Call) -> Result:
    """Dims are the equation's letters; letters missing from the output are reductions.

    FLOPs: torch lowers a two-operand einsum to one bmm over all letters, so 2 * prod(sizes) when
    something is contracted; one operand (a sum or a permutation) is memory-bound.
    """
    equation = call.args["equation"].replace(" ", "")
    operands = list(call.args["operands"])
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = list(operands[0])
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    spare = iter(c for c in string.ascii_uppercase if c not in equation)
    ell: list[str] = []
    for t, x in zip(terms, operands):  # '...' stands for the same leading letters everywhere
        if "..." in t:
            need = x.ndim - (len(t) - 3)
            while len(ell) < need:
                ell.insert(0, next(spare))
    terms = [t.replace("...", "".join(ell[len(ell) - (x.ndim - (len(t) - 3)):])) for t, x in zip(terms, operands)]
    if not arrow:  # implicit output: letters used once, alphabetical, after the ellipsis
        rhs = "".join(ell) + "".join(sorted(c for c in set("".join(terms)) if "".join(terms).count(c) == 1 and c not in ell))
    rhs = rhs.replace("...", "".join(ell))
    sizes: dict[str, int] = {}
    for t, x in zip(terms, operands):
        for c, s in zip(t, x.shape):
            sizes[c] = max(sizes.get(c, 1), s)
    order = list(dict.fromkeys("".join(terms)))
    dims = [Dim(c, sizes[c], reduction=c not in rhs) for c in order]
    reads = []
    for t, x in zip(terms, operands):
        reads.append((x, tuple((c,) if s == sizes[c] else () for c, s in zip(t, x.shape))))
    contracted = any(d.reduction for d in dims)
    flops = 2 * math.prod(sizes.values()) if len(operands) >= 2 and contracted else 0
    return Result("einsum", dims, reads, [names_axes(list(rhs))], flops, {"equation": f"{','.join(terms)}->{rhs}"})
