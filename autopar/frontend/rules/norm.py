"""layer_norm and batch_norm: memory-bound (0 FLOPs in flop_counter), priced by bytes.

layer_norm normalizes over its trailing ``normalized_shape`` axes: those dims are unsplittable
(a split would need the mean and variance of the whole row). batch_norm keeps ``b`` splittable the
way data parallelism (and PaSE) runs it, with per-shard batch statistics; its spatial dims stay
unsplittable like the convolutions around it, and the channel dim ``c`` splits freely.
"""

from __future__ import annotations

from autopar.core.ir import Dim
from autopar.frontend.rules.base import Call, Result, Tensor, lead_names, names_axes


def layer_norm(call: Call) -> Result:
    x = call.args["input"]
    shape = tuple(call.args["normalized_shape"]) if isinstance(call.args["normalized_shape"], (list, tuple)) \
        else (int(call.args["normalized_shape"]),)
    k = len(shape)
    lead = lead_names(x.ndim - k)
    norm = ["n"] if k == 1 else [f"n{i}" for i in range(k)]
    dims = [Dim(n, s) for n, s in zip(lead, x.shape)] + [Dim(n, s, splittable=False) for n, s in zip(norm, shape)]
    reads = [(x, names_axes(lead + norm))]
    for key in ("weight", "bias"):
        if isinstance(call.args.get(key), Tensor):
            reads.append((call.args[key], names_axes(norm)))
    eps = call.args.get("eps", 1e-5)
    attrs = {"normalized_shape": shape, "eps": float(eps) if eps is not None else None}
    if "kind" in call.fixed:  # rms_norm: the same space, no mean subtracted
        attrs["kind"] = call.fixed["kind"]
    return Result("layer_norm", dims, reads, [names_axes(lead + norm)], 0, attrs)


def batch_norm(call: Call) -> Result:
    x = call.args["input"]
    spatial = {1: ["l"], 2: ["h", "w"], 3: ["t", "h", "w"]}.get(x.ndim - 2, [f"x{i}" for i in range(x.ndim - 2)])
    names = (["b", "c"] + spatial) if x.ndim >= 2 else ["c"]
    dims = [Dim(n, s, splittable=n not in spatial) for n, s in zip(names, x.shape)]
    reads = [(x, names_axes(names))]
    for key in ("weight", "bias", "running_mean", "running_var"):
        if isinstance(call.args.get(key), Tensor):
            reads.append((call.args[key], (("c",),)))
    training = bool(call.args.get("training", False))
    attrs = {"eps": float(call.args.get("eps", 1e-5)), "momentum": call.args.get("momentum", 0.1),
             "training": training, "ndim": x.ndim - 2}
    return Result("batch_norm", dims, reads, [names_axes(names)], 0, attrs)
