"""cross_entropy: log_softmax over the classes, then the mean (or sum) of the picked entries.

The class dim ``c`` is unsplittable (the log-softmax needs the whole row). With reduction "mean"
or "sum" the batch (and any extra spatial) dims are reductions: each shard's loss is a partial
sum, as in data parallelism. flop_counter counts no FLOPs here: priced by bytes.
"""

from __future__ import annotations

from autopar.core.ir import Dim
from autopar.frontend.rules.base import Call, Result, Tensor

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}  # aten's enum


def cross_entropy(call: Call) -> Result:
    x, target = call.args["input"], call.args["target"]
    reduction = call.args.get("reduction", "mean")
    reduction = _REDUCTIONS.get(reduction, reduction) if isinstance(reduction, int) else reduction
    reduced = reduction != "none"
    if x.ndim == 1:
        names = ["c"]
    else:
        names = ["b", "c"] + [f"d{i}" for i in range(1, x.ndim - 1)]
    dims = [Dim(n, s, reduction=reduced and n != "c", splittable=n != "c") for n, s in zip(names, x.shape)]
    x_axes = tuple((n,) for n in names)
    reads = [(x, x_axes)]
    if target.ndim == x.ndim:  # class probabilities, same layout as the logits
        reads.append((target, x_axes))
    else:
        reads.append((target, tuple((n,) for n in names if n != "c")))
    weight = call.args.get("weight")
    if isinstance(weight, Tensor):
        reads.append((weight, (("c",),)))
    out_axes = () if reduced else tuple((n,) for n in names if n != "c")
    attrs = {"reduction": reduction, "ignore_index": call.args.get("ignore_index", -100),
             "label_smoothing": float(call.args.get("label_smoothing", 0.0) or 0.0)}
    return Result("cross_entropy", dims, reads, [out_axes], 0, attrs)
