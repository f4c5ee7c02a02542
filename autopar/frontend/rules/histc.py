"""histc: counts of a tensor's entries in ``bins`` equal bins over ``[min, max]``.

Every entry lands in one bin, whichever axis it sits on, so each input axis is a reduction: a
shard of it counts its own entries, a partial sum of the histogram (summed where the counts are
read whole). A mixture of experts' router counts the tokens each expert receives with it (the
load-balancing loss of Switch/GShard). With ``min == max`` (the default, 0) the range is the data's
own minimum and maximum, which a shard does not know: then no axis splits.
"""

from __future__ import annotations

from autopar.core.ir import Dim
from autopar.frontend.rules.base import Call, Result, generic_names, names_axes

SITES = {"histc": ("histc", "input, bins=100, min=0, max=0", {})}


def histc(call: Call) -> Result:
    x = call.args["input"]
    bins = int(call.args["bins"])
    ranged = float(call.args["min"]) != float(call.args["max"])  # the data's own range: no split
    names = generic_names(x.ndim)
    dims = [Dim(n, s, reduction=True, splittable=ranged) for n, s in zip(names, x.shape)]
    dims.append(Dim("bins", bins, splittable=False))
    return Result("histc", dims, [(x, names_axes(names))], [(("bins",),)], 0,
                  {"bins": bins, "min": float(call.args["min"]), "max": float(call.args["max"])})
