"""conv1d / conv2d: batch, output channels, output positions, and the reductions in-ch x taps.

Output positions (``l`` or ``h``, ``w``) and kernel taps are unsplittable: a split needs a halo
exchange that the plain shard layout cannot express, so the input's spatial axes map to ``()``.
With ``groups > 1`` a dim ``g`` indexes the groups, and every channel axis is the merged
``("g", "c_out")`` / ``("g", "c_in")``: splitting ``g`` keeps each group whole on one device.
FLOPs: 2 * b * c_out * positions * (c_in / groups) * taps, bias not counted (as flop_counter).
"""

from __future__ import annotations

import math

from autopar.core.ir import Dim
from autopar.frontend.rules.base import Call, Result, Tensor, as_tuple


def conv(call: Call) -> Result:
    x, w, bias = call.args["input"], call.args["weight"], call.args.get("bias")
    if call.args.get("transposed"):
        from autopar.frontend.rules.opaque import opaque

        call.fixed["reason"] = "transposed convolution has no split rule yet"
        return opaque(call)
    ndim = w.ndim - 2
    out = call.outs[0]
    groups = int(call.args.get("groups", 1) or 1)
    batched = x.ndim == ndim + 2
    spatial = ["l"] if ndim == 1 else ["h", "w", "t"][:ndim] if ndim <= 2 else [f"x{i}" for i in range(ndim)]
    taps = ["k"] if ndim == 1 else ["kh", "kw"] if ndim == 2 else [f"k{i}" for i in range(ndim)]
    c_out, c_in_g = w.shape[0], w.shape[1]
    out_sp = out.shape[-ndim:]
    dims = []
    if batched:
        dims.append(Dim("b", x.shape[0]))
    if groups > 1:
        dims.append(Dim("g", groups))
    dims.append(Dim("c_out", c_out // groups))
    dims += [Dim(n, s, splittable=False) for n, s in zip(spatial, out_sp)]
    dims.append(Dim("c_in", c_in_g, reduction=True))
    dims += [Dim(n, s, reduction=True, splittable=False) for n, s in zip(taps, w.shape[2:])]
    chan_out = ("g", "c_out") if groups > 1 else ("c_out",)
    chan_in = ("g", "c_in") if groups > 1 else ("c_in",)
    lead = (("b",),) if batched else ()
    x_axes = lead + (chan_in,) + ((),) * ndim
    w_axes = (chan_out, ("c_in",)) + tuple((t,) for t in taps)
    reads = [(x, x_axes), (w, w_axes)]
    if isinstance(bias, Tensor):
        reads.append((bias, (chan_out,)))
    out_axes = lead + (chan_out,) + tuple((n,) for n in spatial)
    flops = 2 * (x.shape[0] if batched else 1) * c_out * math.prod(out_sp) * c_in_g * math.prod(w.shape[2:])
    padding = call.args.get("padding", 0)
    attrs = {
        "stride": as_tuple(call.args.get("stride", 1), ndim),
        "padding": padding if isinstance(padding, str) else as_tuple(padding, ndim),
        "dilation": as_tuple(call.args.get("dilation", 1), ndim),
        "groups": groups,
        "kernel": tuple(w.shape[2:]),
        "bias": isinstance(bias, Tensor),
    }
    if "padding_mode" in call.fixed:
        attrs["padding_mode"] = call.fixed["padding_mode"]
    return Result(f"conv{ndim}d", dims, reads, [out_axes], flops, attrs)
