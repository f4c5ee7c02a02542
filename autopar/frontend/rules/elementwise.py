"""Elementwise ops (unary, binary with broadcasting, masked_fill, where, casts) and dropout.

Every output axis is a free dim; an operand axis of size 1 broadcast to a larger output axis maps
to ``()``. Python numbers are not operands: the one a call uses is kept in ``attrs["scalar"]``.
"""

from __future__ import annotations

from numbers import Number

from autopar.frontend.rules.base import Call, Result, Tensor, broadcast_axes, generic_names, names_axes, same_dims


def elementwise(call: Call) -> Result:
    out = call.outs[0]
    names = generic_names(len(out.shape))
    reads = [(t, broadcast_axes(t.shape, out.shape, names)) for t in call.tensors()]
    attrs: dict = {"fn": call.fixed.get("fn", call.target.rsplit(".", 1)[-1])}
    positional = list(call.args.get("args", ()))
    for k, v in call.args.items():
        if k not in ("args", "kwargs"):
            positional.append(v)
    scalars = [v for v in positional if isinstance(v, Number) and not isinstance(v, bool)]
    if scalars and reads:
        attrs["scalar"] = scalars[0]
        first = next(i for i, v in enumerate(positional) if isinstance(v, (Number, Tensor)))
        if not isinstance(positional[first], Tensor):
            attrs["scalar_first"] = True  # 1.0 / x, 2 - x: the number is the left operand
    for k, v in dict(call.args.get("kwargs", {})).items():
        if not isinstance(v, Tensor) and k not in ("out", "inplace"):
            attrs[k] = str(v).replace("torch.", "") if k == "dtype" else v
    if reads and out.dtype != reads[0][0].dtype and attrs["fn"] in ("to", "type", "type_as", "float", "half", "bfloat16", "double", "int", "long", "bool"):
        attrs["fn"], attrs["dtype"] = "to", out.dtype
    return Result("elementwise", same_dims(names, out.shape), reads, [names_axes(names)] * len(call.outs), 0, attrs)


def dropout(call: Call) -> Result:
    x = call.args["input"]
    names = generic_names(x.ndim)
    p = float(call.args.get("p", 0.5))
    training = bool(call.args.get("training", True))
    return Result("dropout", same_dims(names, x.shape), [(x, names_axes(names))], [names_axes(names)], 0,
                  {"p": p, "training": training})
