"""scaled_dot_product_attention: ``softmax(q k^T * scale + mask) v`` as one node.

Dims: ``b`` (and ``h``) batch-like, ``l`` query positions, ``m`` key positions, ``e`` the q/k
head dim, ``v`` the value head dim. ``m`` and ``e`` are reductions, but unsplittable: a split
leaves partial scores before the softmax, which no all-reduce repairs (that is ring/flash
attention, a different algorithm). FLOPs as flop_counter's sdpa formula: 2*B*L*M*E + 2*B*L*M*V
(the causal mask does not halve them).
"""

from __future__ import annotations

import math

from autopar.core.ir import Dim
from autopar.frontend.rules.base import Call, Result, Tensor, broadcast_axes, names_axes


def sdpa(call: Call) -> Result:
    q, k, v = call.args["query"], call.args["key"], call.args["value"]
    nb = q.ndim - 2
    bnames = ["b", "h"][:nb] if nb <= 2 else [f"b{i}" for i in range(nb)]
    batch = q.shape[:nb]
    L, E = q.shape[-2:]
    M, V = k.shape[-2], v.shape[-1]
    dims = [Dim(n, s) for n, s in zip(bnames, batch)]
    dims += [Dim("l", L), Dim("m", M, reduction=True, splittable=False),
             Dim("e", E, reduction=True, splittable=False), Dim("v", V)]
    kv_b = lambda t: broadcast_axes(t.shape[:-2], batch, bnames)  # noqa: E731
    q_axes = names_axes(bnames + ["l", "e"])
    out_axes = names_axes(bnames + ["l", "v"])
    gqa = bool(call.args.get("enable_gqa")) and nb == 2 and k.shape[1] != q.shape[1]
    if gqa:
        # grouped-query attention in the kernel: query head = kv head * group + r, so the kv heads
        # ``h`` are the major dim of the query heads ``("h", "r")``: a head split keeps groups whole
        group = q.shape[1] // k.shape[1]
        dims[1:2] = [Dim("h", k.shape[1]), Dim("r", group)]
        q_axes = (("b",), ("h", "r")) + q_axes[2:]
        out_axes = (("b",), ("h", "r")) + out_axes[2:]
        kv_b = lambda t: (("b",) if t.shape[0] == batch[0] else (), ("h",))  # noqa: E731
    reads = [(q, q_axes), (k, kv_b(k) + (("m",), ("e",))), (v, kv_b(v) + (("m",), ("v",)))]
    mask = call.args.get("attn_mask")
    if isinstance(mask, Tensor):
        mask_axes = broadcast_axes(mask.shape, tuple(batch) + (L, M), bnames + ["l", "m"])
        if gqa and mask.ndim >= 3 and mask_axes[-3]:  # a per-head mask follows the query heads
            mask_axes = mask_axes[:-3] + (("h", "r"),) + mask_axes[-2:]
        reads.append((mask, mask_axes))
    b = math.prod(batch)
    flops = 2 * b * L * M * E + 2 * b * L * M * V
    attrs = {"is_causal": bool(call.args.get("is_causal", False)), "dropout_p": float(call.args.get("dropout_p", 0.0) or 0.0),
             "scale": call.args.get("scale"), "mask": isinstance(mask, Tensor)}
    if gqa:
        attrs["enable_gqa"] = True
    return Result("sdpa", dims, reads, [out_axes], flops, attrs)
