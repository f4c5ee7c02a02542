"""Gathers and position-dependent ops: index (advanced indexing), gather, index_select, pad, triu/tril.

A gathered axis is read whole (any element may be picked), so the source's indexed axes map to
``()``; every output axis is a free dim, and the index tensors broadcast onto the output axes
they produce, like operands of an elementwise op. ``pad`` keeps the padded axes whole (the pad
sits at one end, not in every shard); ``triu``/``tril`` keep their two matrix axes whole (each
element's fate depends on its position). No FLOPs: priced by bytes.
"""

from __future__ import annotations

from autopar.core.ir import Dim
from autopar.frontend.rules.base import (Call, Result, Tensor, broadcast_axes, generic_names, names_axes,
                                          norm_axis, same_dims)


def index(call: Call) -> Result:
    """``aten.index.Tensor(x, [i0, None, i2, ...])``: torch's advanced-indexing layout rules."""
    x, out = call.args["input"], call.outs[0]
    indices = list(call.args["indices"])
    if any(isinstance(i, Tensor) and i.dtype == "bool" for i in indices):
        raise ValueError("boolean-mask indexing has a data-dependent shape")
    indices += [None] * (x.ndim - len(indices))
    picked = [a for a, i in enumerate(indices) if isinstance(i, Tensor)]
    tensors = [indices[a] for a in picked]
    block = _broadcast([t.shape for t in tensors])
    adjacent = picked == list(range(picked[0], picked[-1] + 1))
    rest = [a for a in range(x.ndim) if a not in picked]
    start = picked[0] if adjacent else 0  # where the index block sits in the output
    order = rest[:start] + ["block"] + rest[start:] if adjacent else ["block"] + rest
    names = generic_names(out.ndim)
    x_axes: list[tuple] = [()] * x.ndim
    block_names: list[str] = []
    j = 0
    for item in order:
        if item == "block":
            block_names = names[j:j + len(block)]
            j += len(block)
        else:
            x_axes[item] = (names[j],)
            j += 1
    if j != out.ndim:
        raise ValueError(f"index result rank {out.ndim}, expected {j}")
    reads = [(x, tuple(x_axes))] + [(t, broadcast_axes(t.shape, block, block_names)) for t in tensors]
    return Result("gather", same_dims(names, out.shape), reads, [names_axes(names)], 0, {"kind": "index",
                  "picked": tuple(picked)})


def gather(call: Call) -> Result:
    """``torch.gather(x, dim, index)``: out[..i..] = x[..index[..i..]..] along ``dim``."""
    x, idx, out = call.args["input"], call.args["index"], call.outs[0]
    axis = norm_axis(int(call.args["dim"]), x.ndim)
    names = generic_names(out.ndim)
    x_axes = tuple(() if a == axis or x.shape[a] != idx.shape[a] else (names[a],) for a in range(x.ndim))
    return Result("gather", same_dims(names, out.shape), [(x, x_axes), (idx, names_axes(names))],
                  [names_axes(names)], 0, {"kind": "gather", "axis": axis})


def index_select(call: Call) -> Result:
    """``torch.index_select(x, dim, index)``: ``dim`` becomes ``len(index)``; the rest flows."""
    x, idx, out = call.args["input"], call.args["index"], call.outs[0]
    axis = norm_axis(int(call.args["dim"]), x.ndim)
    names = generic_names(out.ndim)
    x_axes = tuple(() if a == axis else (names[a],) for a in range(x.ndim))
    return Result("gather", same_dims(names, out.shape), [(x, x_axes), (idx, ((names[axis],),) if idx.ndim else ())],
                  [names_axes(names)], 0, {"kind": "index_select", "axis": axis})


def pad(call: Call) -> Result:
    """``F.pad``/``aten.pad``/``constant_pad_nd``: pairs from the last axis backwards."""
    x, out = call.args["input"], call.outs[0]
    widths = list(call.args["pad"])
    padded = {x.ndim - 1 - i // 2 for i, w in enumerate(widths) if w}
    names = generic_names(x.ndim)
    dims = [Dim(n, s, splittable=a not in padded) for a, (n, s) in enumerate(zip(names, out.shape))]
    x_axes = tuple(() if a in padded else (n,) for a, n in enumerate(names))
    mode = call.args.get("mode", "constant")
    return Result("pad", dims, [(x, x_axes)], [names_axes(names)], 0,
                  {"pad": tuple(widths), "mode": mode, "value": call.args.get("value")})


def positional(call: Call) -> Result:
    """``triu``/``tril``: the last two axes stay whole; leading (batch) axes split freely."""
    x = call.args["input"]
    names = generic_names(x.ndim)
    dims = same_dims(names, x.shape, unsplittable=set(names[-2:]))
    return Result("elementwise", dims, [(x, names_axes(names))], [names_axes(names)], 0,
                  {"fn": call.fixed["fn"], "diagonal": int(call.args.get("diagonal", 0))})


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    n = max(len(s) for s in shapes)
    out = [1] * n
    for s in shapes:
        for i, size in enumerate((1,) * (n - len(s)) + tuple(s)):
            out[i] = max(out[i], size)
    return tuple(out)
