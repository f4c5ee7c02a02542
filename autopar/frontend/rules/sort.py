"""sort and argsort: a tensor's entries ordered along one axis (and, for sort, where each came from).

Elementwise in every other axis; the sorted axis stays whole (each shard of it would need the
others' entries to know its order). A mixture of experts' dispatch groups each token's routed
assignments by expert with it (``argsort`` over a batch row's ``tokens x top_k`` expert ids), so
the batch can be split while each row sorts whole.
"""

from __future__ import annotations

from autopar.core.ir import Dim
from autopar.frontend.rules.base import Call, Result, generic_names, names_axes, norm_axis

SORT = "input, dim=-1, descending=False, stable=False"
SITES = {"sort": ("sort", SORT, {"kind": "sort"}), "argsort": ("sort", SORT, {"kind": "argsort"})}


def sort(call: Call) -> Result:
    x = call.args["input"]
    axis = norm_axis(int(call.args["dim"]), max(x.ndim, 1))
    names = generic_names(x.ndim)
    dims = [Dim(n, s, splittable=i != axis) for i, (n, s) in enumerate(zip(names, x.shape))]
    attrs = {"axis": axis, "descending": bool(call.args["descending"]), "kind": call.fixed.get("kind", "sort")}
    return Result("sort", dims, [(x, names_axes(names))], [names_axes(names)] * len(call.outs), 0, attrs)
