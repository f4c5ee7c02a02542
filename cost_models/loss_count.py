"""The forward all-reduce of a mean cross-entropy over class indices whose averaged items are
split: ``codegen/op_fixes.counted_mean`` sums the shards' counts of counted targets (those not
``ignore_index``) so that each shard's mean is weighted by its share of the whole batch's count.
One float64 over the mesh axes that cut the averaged dims; it has no backward."""

from __future__ import annotations

import numpy as np

from autopar.core.cluster import Cluster
from autopar.core.ir import Node
from autopar.core.tables import Config, Mesh
from autopar.cost_models.comm import Collective, collective, collective_time

COUNT_BYTES = 8  # the count is summed in float64 (exact past float32's 2**24 targets)


def _counted(node: Node) -> list[int]:
    """Indices of the dims whose split needs the count, [] when the node needs none."""
    if (node.op != "cross_entropy" or len(node.inputs) < 2
            or not node.inputs[1].spec.dtype.startswith(("int", "uint"))
            or node.attrs.get("reduction", "mean") != "mean"):
        return []
    return [i for i, d in enumerate(node.dims) if d.reduction]


def loss_count(node: Node, cfg: Config, mesh: Mesh, cluster: Cluster) -> Collective | None:
    """The count's all-reduce for one config (mapped onto the mesh), None where none is run."""
    dims = _counted(node)
    if not dims or not cfg.mesh_axes:
        return None
    axes = tuple(sorted(a for i in dims for a in cfg.mesh_axes[i]))
    if not axes:
        return None
    c = collective("all-reduce", COUNT_BYTES, axes, mesh, cluster)
    return c if c.p > 1 else None


def loss_count_many(node: Node, own: np.ndarray, mesh: Mesh, cluster: Cluster) -> np.ndarray:
    """``loss_count(...).seconds`` for every config (rows of the owner matrix) at once."""
    dims = _counted(node)
    if not dims or not len(mesh.shape):
        return np.zeros(len(own))
    sizes = np.asarray(mesh.shape, dtype=float)
    level = np.asarray(mesh.level or (0,) * len(mesh.shape)) > 0
    cut = np.isin(own, dims)
    p = np.prod(np.where(cut, sizes, 1.0), axis=1)
    cross = (cut & level).any(axis=1)
    bw = np.where(cross, cluster.inter_bandwidth, cluster.intra_bandwidth)
    lat = np.where(cross, cluster.inter_latency, cluster.intra_latency)
    t = collective_time("all-reduce", float(COUNT_BYTES), p, bw, lat, cluster.call_latency)
    return np.where(p > 1, t, 0.0)
