"""max/avg pooling, plain and adaptive, 1-D and 2-D.

Like a convolution's, the output positions are unsplittable (windows straddle shard borders) and
the input's spatial axes map to ``()``; batch and channels split freely. No FLOPs (flop_counter
counts none): priced by bytes.
"""

from __future__ import annotations

from autopar.frontend.rules.base import Call, Result, as_tuple, names_axes, same_dims


def pool(call: Call) -> Result:
    x = call.args["input"]
    nd = int(call.fixed.get("ndim", 2))
    kind = call.fixed.get("kind", "max")
    adaptive = bool(call.fixed.get("adaptive", False))
    out = call.outs[0]
    spatial = ["l"] if nd == 1 else ["h", "w"] if nd == 2 else [f"x{i}" for i in range(nd)]
    lead = ["b", "c"][2 - (x.ndim - nd):] if x.ndim - nd <= 2 else [f"b{i}" for i in range(x.ndim - nd)]
    names = lead + spatial
    dims = same_dims(names, out.shape, unsplittable=set(spatial))
    in_axes = names_axes(lead) + ((),) * nd
    outs = [names_axes(names)] * len(call.outs)  # max_pool's indices, when asked for, align with values
    attrs = {"kind": kind, "adaptive": adaptive, "ndim": nd}
    if adaptive:
        attrs.update(kernel=None, stride=None, padding=(0,) * nd, output_size=tuple(out.shape[-nd:]))
    else:
        kernel = as_tuple(call.args["kernel_size"], nd)
        stride = call.args.get("stride")
        attrs.update(kernel=kernel, stride=as_tuple(stride, nd) if stride not in (None, [], ()) else kernel,
                     padding=as_tuple(call.args.get("padding", 0), nd), output_size=tuple(out.shape[-nd:]),
                     ceil_mode=bool(call.args.get("ceil_mode", False)))
        if kind == "max":
            attrs["dilation"] = as_tuple(call.args.get("dilation", 1), nd)
        else:
            attrs["count_include_pad"] = bool(call.args.get("count_include_pad", True))
    return Result("pool", dims, [(x, in_axes)], outs, 0, attrs)
