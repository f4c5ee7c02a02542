"""embedding: ``out[..., d] = W[idx[...], d]``.

The vocabulary dim ``v`` is a reduction: with ``W`` split by rows each device looks up only the
indices it owns and contributes zeros elsewhere, so the shards' outputs sum to the answer (the
vocab-parallel embedding of Megatron). flop_counter counts no FLOPs for a lookup; it is priced by
bytes: the gathered rows read and the output written, not the whole table.
"""

from __future__ import annotations

from autopar.core.ir import DTYPE_BYTES, Dim
from autopar.frontend.rules.base import Call, Result, lead_names, names_axes, plain_attrs


def embedding(call: Call) -> Result:
    idx, w = call.args["input"], call.args["weight"]
    out = call.outs[0]
    lead = lead_names(idx.ndim)
    dims = [Dim(n, s) for n, s in zip(lead, idx.shape)] + [Dim("d", w.shape[1]), Dim("v", w.shape[0], reduction=True)]
    reads = [(idx, names_axes(lead)), (w, names_axes(["v", "d"]))]
    attrs = plain_attrs(call.args, skip=("input", "weight"))
    attrs.update(num_embeddings=w.shape[0], embedding_dim=w.shape[1])
    item = DTYPE_BYTES.get(w.dtype, 4)
    read = idx.numel * w.shape[1] * item + idx.numel * DTYPE_BYTES.get(idx.dtype, 8)
    return Result("embedding", dims, reads, [names_axes(lead + ["d"])], 0, attrs,
                  bytes_read=read, bytes_written=out.numel * item)
