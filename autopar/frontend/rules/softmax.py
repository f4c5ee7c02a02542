"""softmax / log_softmax: elementwise except along ``axis``, which is unsplittable.

A split softmax axis is not a plain reduction (the shards need each other's max and sum before
any output is right), so no later stage may split it.
"""

from __future__ import annotations

from autopar.frontend.rules.base import Call, Result, generic_names, names_axes, norm_axis, same_dims


def softmax(call: Call) -> Result:
    x = call.args["input"]
    dim = call.args.get("dim")
    if dim is None:  # torch's legacy implicit dim: 0 for 0-, 1- and 3-D input, else 1
        dim = 0 if x.ndim in (0, 1, 3) else 1
    axis = norm_axis(int(dim), max(x.ndim, 1))
    names = generic_names(x.ndim)
    dims = same_dims(names, x.shape, unsplittable={names[axis]} if names else ())
    op = call.fixed.get("kind", "softmax")
    attrs = {"axis": axis}
    if call.args.get("dtype") is not None:
        attrs["dtype"] = str(call.args["dtype"]).replace("torch.", "")
    return Result(op, dims, [(x, names_axes(names))], [names_axes(names)], 0, attrs)
