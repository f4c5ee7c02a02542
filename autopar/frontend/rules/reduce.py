"""sum / mean (and max/min-like reductions) over some axes; cumsum-like scans along one.

Reduced dims are reductions: split, each shard holds a partial sum (a partial mean needs the
same all-reduce, scaled). A split max/min is not a sum, so those dims are also unsplittable.
flop_counter counts no FLOPs for reductions: they are priced by bytes.
"""

from __future__ import annotations

from autopar.core.ir import Dim
from autopar.frontend.rules.base import Call, Result, Tensor, generic_names, names_axes, norm_axis, same_dims

SUMMABLE = ("sum", "mean")


def reduce(call: Call) -> Result:
    x = call.args["input"]
    fn = call.fixed.get("fn", "sum")
    dim = call.args.get("dim")
    if isinstance(dim, Tensor):  # torch.max(a, b): elementwise, not a reduction
        from autopar.frontend.rules.elementwise import elementwise

        call.fixed = {**call.fixed, "fn": {"max": "maximum", "min": "minimum"}.get(fn, fn)}
        call.args = {"args": (x, dim), "kwargs": {}}
        return elementwise(call)
    keepdim = bool(call.args.get("keepdim", False))
    if dim is None or dim == () or dim == []:
        axes = tuple(range(x.ndim))
    else:
        axes = tuple(sorted(norm_axis(int(d), x.ndim) for d in (dim if isinstance(dim, (list, tuple)) else [dim])))
    names = generic_names(x.ndim)
    dims = [Dim(n, s, reduction=i in axes, splittable=i not in axes or fn in SUMMABLE)
            for i, (n, s) in enumerate(zip(names, x.shape))]
    out_axes = []
    for i, n in enumerate(names):
        if i not in axes:
            out_axes.append((n,))
        elif keepdim:
            out_axes.append(())
    return Result("reduce", dims, [(x, names_axes(names))], [tuple(out_axes)] * len(call.outs), 0,
                  {"fn": fn, "axes": axes, "keepdim": keepdim})


def scan(call: Call) -> Result:
    """cumsum/cumprod along one axis: that axis stays whole (each element needs all before it)."""
    x = call.args["input"]
    axis = norm_axis(int(call.args["dim"]), x.ndim)
    names = generic_names(x.ndim)
    return Result("scan", same_dims(names, x.shape, unsplittable={names[axis]}), [(x, names_axes(names))],
                  [names_axes(names)], 0, {"fn": call.fixed.get("fn", "cumsum"), "axis": axis})
