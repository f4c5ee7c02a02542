"""topk: the k largest (or smallest) values along one axis, and their indices.

Elementwise in every other axis; the chosen axis stays whole (every shard of it would need the
others' candidates), and the outputs' k entries along it map to no dim. A mixture of experts'
router picks each token's experts with it, so the tokens can be split while the experts' scores
stay whole.
"""

from __future__ import annotations

from autopar.core.ir import Dim
from autopar.frontend.rules.base import Call, Result, generic_names, names_axes, norm_axis

SITES = {"topk": ("topk", "input, k, dim=-1, largest=True, sorted=True", {})}


def topk(call: Call) -> Result:
    x = call.args["input"]
    axis = norm_axis(int(call.args["dim"]), max(x.ndim, 1))
    names = generic_names(x.ndim)
    dims = [Dim(n, s, reduction=i == axis, splittable=i != axis) for i, (n, s) in enumerate(zip(names, x.shape))]
    out = tuple(() if i == axis else (n,) for i, n in enumerate(names))
    attrs = {"k": int(call.args["k"]), "axis": axis, "largest": bool(call.args["largest"])}
    return Result("topk", dims, [(x, names_axes(names))], [out] * len(call.outs), 0, attrs)
