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
