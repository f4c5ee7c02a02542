"""The alpha-beta price of one ring collective: bandwidth term plus latency steps.

Its own module because both the per-pair reshard prices (``comm``) and the bulk edge tables
(``reshard_table``) use it, and neither should import the other to get it.
"""

from __future__ import annotations

import numpy as np

from autopar.core.cluster import COLLECTIVE_KINDS

KINDS = COLLECTIVE_KINDS  # the kinds priced here (the cluster's list, which kind_factors names)

# (bandwidth multiplier as a function of p, latency steps as a function of p)
BANDWIDTH_TERM = {"all-reduce": lambda p: 2 * (p - 1) / p, "all-gather": lambda p: (p - 1) / p,
                  "reduce-scatter": lambda p: (p - 1) / p, "all-to-all": lambda p: (p - 1) / p,
                  "broadcast": lambda p: 1.0 + 0 * p, "send/recv": lambda p: 1.0 + 0 * p}
LATENCY_TERM = {"all-reduce": lambda p: 2 * (p - 1), "all-gather": lambda p: p - 1,
                "reduce-scatter": lambda p: p - 1, "all-to-all": lambda p: p - 1,
                "broadcast": lambda p: p - 1, "send/recv": lambda p: 1 + 0 * p}
FORMULA = {"all-reduce": "2(p-1)/p*N/bw + 2(p-1)*a", "all-gather": "(p-1)/p*N/bw + (p-1)*a",
           "reduce-scatter": "(p-1)/p*N/bw + (p-1)*a", "all-to-all": "(p-1)/p*N/bw + (p-1)*a",
           "broadcast": "N/bw + (p-1)*a", "send/recv": "N/bw + a"}


def collective_time(kind: str, nbytes, p, bandwidth, latency, fixed=0.0):
    """Seconds of one ring collective; works elementwise on numpy arrays. p <= 1 costs 0.
    ``fixed``: paid once per collective (``Cluster.call_latency``)."""
    if not any(isinstance(x, np.ndarray) for x in (nbytes, p, bandwidth, latency, fixed)):
        if p <= 1:
            return 0.0
        return float(BANDWIDTH_TERM[kind](p) * nbytes / bandwidth + LATENCY_TERM[kind](p) * latency + fixed)
    p = np.asarray(p, dtype=float)
    safe = np.maximum(p, 1.0)
    t = BANDWIDTH_TERM[kind](safe) * np.asarray(nbytes, dtype=float) / bandwidth + LATENCY_TERM[kind](safe) * latency + fixed
    return np.where(p > 1, t, 0.0)


def as_run(kind: str, nbytes, p, backend: str):
    """``(kind, nbytes)`` of what ``backend`` really runs for ``kind``. A CPU process group
    (gloo), measured on the benchmark machine with 2 processes: its reduce-scatter costs an
    all-reduce of the same input (4 MiB: 5.0 ms, the all-reduce 4.3 ms), and DTensor runs an
    all-to-all on it as an all-gather of the whole tensor and a local chunk. Elsewhere (NCCL):
    the ring collectives as named."""
    if backend == "gloo":
        if kind == "reduce-scatter":
            return "all-reduce", nbytes
        if kind == "all-to-all":
            return "all-gather", nbytes * p
    return kind, nbytes


def reshard_local(kind: str, run_bytes, p, cluster):
    """Seconds a reshard step costs a rank beyond its collective (``Cluster.move_call``,
    ``copy_time``, ``strided_copy_time``); works elementwise on numpy arrays. p <= 1 costs 0.

    The runtime's move (``codegen/moves.py``) copies the collective's buffer once around the
    call: an all-reduce clones its input (never reduced in place: it may be saved for a
    backward), a reduce-scatter stacks the blocks of the scattered dim first, a gather puts the
    ranks' blocks side by side after (DTensor's cat does the same), gloo's all-to-all is a gather
    and a block copy. ``run_bytes``: the bytes of what the backend runs (``as_run``), the buffer
    copied. A shard of the leading dim needs no copy; it is priced as the others (the tables
    price layouts by mesh axis, not by the tensor dim they cut)."""
    if not any(isinstance(x, np.ndarray) for x in (run_bytes, p)):
        return float(cluster.move_call + copy_rate(kind, cluster, p) * run_bytes) if p > 1 else 0.0
    p = np.asarray(p, dtype=float)
    t = cluster.move_call + copy_rate(kind, cluster, np.maximum(p, 1.0)) * np.asarray(run_bytes, dtype=float)
    return np.where(p > 1, t, 0.0)


def copy_rate(kind: str, cluster, p):
    """Seconds per byte of the buffer of a reshard step of ``kind`` over ``p`` ranks, for the
    copies around it (``reshard_local``). gloo's reduce-scatter also copies its result (1/p of
    the input) out of its own buffer on the calling thread."""
    if kind == "all-reduce":
        return cluster.copy_time
    if kind == "reduce-scatter" and cluster.backend == "gloo":
        return cluster.strided_copy_time + cluster.copy_time / p
    return cluster.strided_copy_time
