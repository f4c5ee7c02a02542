"""The price of a weight view's gradient summed with its weight's (``core.weight_views``).

Where the reader's gradient for a replicated view of one weight is a partial sum, the generated
module sums it with the weight's gradient in the reducer's buckets, overlapped with the backward,
instead of by an all-reduce on the edge; the cost model prices that pair as the weight's bucketed
sync (as a node's weight-gradient sync is priced), and lists it there (``collectives``).
"""

from __future__ import annotations

import numpy as np
from autopar.cost_models.comm import collective, collective_time

from autopar.core.buckets import BUCKET_BYTES
from autopar.core.cluster import Cluster
from autopar.core.ir import Node
from autopar.core.tables import Mesh


def lift_weight_view(src: Node, back: np.ndarray, s_codes, d_codes, d_grad, mesh: Mesh,
                     cluster: Cluster) -> np.ndarray:
    """``back`` (an edge's backward reshard prices, source configs x reader configs) with the
    pairs where the reader's partial gradient goes on to the weight (``lifted_grad_axes``: the
    view replicated, read as it is, its gradient replicated or a partial sum per axis) priced as
    the weight's bucketed sync instead. Codes as ``analytic._codes``: 0 replicate, 1 partial."""
    replicated = (s_codes == 0).all(axis=1)
    lifted = (d_codes == 0).all(axis=1) & np.isin(d_grad, (0, 1)).all(axis=1) & (d_grad == 1).any(axis=1)
    if not replicated.any() or not lifted.any():
        return back
    back = back.copy()
    for j in np.flatnonzero(lifted):
        axes = tuple(int(a) for a in np.flatnonzero(d_grad[j] == 1))
        back[replicated, j] = weight_view_sync(src, axes, mesh, cluster)[0]
    return back


def weight_view_sync(src: Node, axes: tuple[int, ...], mesh: Mesh, cluster: Cluster) -> tuple[float, str]:
    """(seconds, formula) of the view's gradient summed over ``axes`` with its weight's, in a
    bucket: the weight's bytes all-reduced, the latency amortized over the bucket."""
    nbytes = src.params[0].spec.nbytes
    c = collective("all-reduce", nbytes, axes, mesh, cluster)
    share = min(1.0, nbytes / BUCKET_BYTES)
    seconds = collective_time(c.run_as or c.kind, c.run_bytes or c.nbytes, c.p, c.bandwidth, c.latency * share,
                              c.fixed * share)
    return seconds, (f"gradient summed with {src.params[0].source}'s in its bucket: {c.formula()}; "
                     f"in buckets of {BUCKET_BYTES / 2**20:g} MiB the latency term counts {share:.4g} "
                     f"of itself = {seconds:.4g} s")
