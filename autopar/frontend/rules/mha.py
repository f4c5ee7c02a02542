"""nn.MultiheadAttention as ONE node (a leaf for the fx tracer, whose forward branches on tensors).

Dims: ``b`` batch, ``l`` query positions, ``m`` key positions (a reduction, unsplittable: the
softmax needs every key), ``e`` the embedding (unsplittable here: the packed q/k/v projection
would have to be cut per head, which this rule does not describe). So a plan may split the batch
and the queries; the projection weights are read whole (replicated, their gradients synchronized
like any replicated parameter). Self-attention reads one tensor as query (``b, l, e``) and as
key and value (``b, m, e``): with ``l`` split, the keys stay whole.
FLOPs as ``torch.utils.flop_counter`` counts the module: the q, k and v projections
(2 B L E^2 + 4 B M E^2), scores and weighted values (4 B L M E, whichever kernel runs), the output
projection (2 B L E^2).
"""

from __future__ import annotations

from autopar.core.ir import Dim
from autopar.frontend.rules.base import Call, Result, Tensor


def mha(call: Call) -> Result:
    q, k, v = call.args["query"], call.args["key"], call.args["value"]
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError("unbatched multi-head attention is not described")
    batch_first = bool(call.fixed["batch_first"])
    if batch_first:
        (B, L, E), M = q.shape, k.shape[1]
        seq = lambda name: (("b",), (name,), ("e",))  # noqa: E731
    else:
        (L, B, E), M = q.shape, k.shape[0]
        seq = lambda name: ((name,), ("b",), ("e",))  # noqa: E731
    dims = [Dim("b", B), Dim("l", L), Dim("m", M, reduction=True, splittable=False),
            Dim("e", E, splittable=False)]
    reads = [(q, seq("l")), (k, seq("m")), (v, seq("m"))]
    kpm = call.args.get("key_padding_mask")
    if isinstance(kpm, Tensor):
        reads.append((kpm, (("b",), ("m",))))
    mask = call.args.get("attn_mask")
    if isinstance(mask, Tensor):
        if mask.ndim != 2:
            raise ValueError("a per-head (3-d) attn_mask is not described")
        reads.append((mask, (("l",), ("m",))))
    for w in call.args["weights"]:
        if isinstance(w, Tensor):
            reads.append((w, ((),) * w.ndim))
    outs = [seq("l")]
    if len(call.outs) > 1:  # the head-averaged attention weights (b, l, m)
        outs.append((("b",), ("l",), ("m",)))
    flops = 2 * B * L * E * E + 4 * B * M * E * E + 4 * B * L * M * E + 2 * B * L * E * E
    attrs = {"heads": int(call.fixed["heads"]), "batch_first": batch_first,
             "need_weights": len(call.outs) > 1}
    return Result("mha", dims, reads, outs[: len(call.outs)], flops, attrs)
