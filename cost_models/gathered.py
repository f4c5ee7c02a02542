"""The bytes one device's share of an embedding lookup moves.

An embedding ``out[..., d] = W[idx[...], d]`` reads the rows its indices gather (one row per
index, ``frontend/rules/embedding.py`` declares them so, not the whole table), its indices, and
writes its output. On a shard each of the three scales with the dims that index it: the gathered
rows with the index dims, ``d`` and the vocabulary ``v`` (a vocab-parallel shard gathers only the
rows it owns), the indices with the index dims, the output (zeros where the row is not owned)
with the index dims and ``d``. The roofline's generic rule, the declared bytes times the shard's
share of all operands' bytes, would count the table's share instead of the rows': on a batch
shard the replicated table is whole, so a data-parallel lookup was priced at nearly its whole
batch's bytes, while the microbatch graph the hierarchical search prices (``core.batch.scale_batch``)
divides them all.
"""

from __future__ import annotations

import numpy as np

from autopar.core.ir import Node


def gathered_bytes(node: Node, splits, moved: float, local_spec, total_spec: float):
    """Local bytes of ``node`` under ``splits`` (per dim: one tuple, or one per config with
    ``local_spec`` an array): the lookup's own count for an embedding, else the roofline's rule,
    ``moved`` (the declared bytes) times the shard's share of its operands' bytes."""
    names = [d.name for d in node.dims]
    if node.op != "embedding" or not node.inputs or "d" not in names or "v" not in names:
        if not total_spec:
            return float(moved) if isinstance(splits, tuple) else np.full(len(splits), float(moved))
        return moved * (local_spec / total_spec)
    s = np.asarray(splits, dtype=float)
    lead = np.prod(s[..., : names.index("d")], axis=-1)
    d, v = s[..., names.index("d")], s[..., names.index("v")]
    idx = node.inputs[0].spec.nbytes
    rows = max(node.bytes_read - idx, 0)
    local = rows / (lead * d * v) + idx / lead + node.bytes_written / (lead * d)
    return local if np.ndim(local) else float(local)
