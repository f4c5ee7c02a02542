"""The forward all-reduce of a mean cross-entropy over class indices whose averaged items are
split: ``codegen/counted.py`` sums the shards' counts of counted targets (those not
``ignore_index``) so that each shard's mean is weighted by its share of the whole batch's count.
One float64 over the mesh axes that cut the averaged dims; it has no backward.

Codegen issues it as soon as the targets exist and waits for it at the loss, so it runs beside
the forward work the targets do not depend on (``core/loss_lead.py``: its FLOPs, ``LEAD_FLOPS``).
What is charged is what that overlap leaves exposed, ``max(0, all-reduce - lead)``, the lead
taken at its fastest (every device of the mesh at the cluster's highest peak): a lower bound on
any plan's time for that work, so the exposed time is never under-charged. The collective itself
(``loss_count``) is what ``cost_models/collectives.py`` lists as issued.
"""

from __future__ import annotations

import math

import numpy as np

from autopar.core.cluster import Cluster
from autopar.core.ir import Node
from autopar.core.loss_lead import LEAD_FLOPS, counts_targets
from autopar.core.tables import Config, Mesh
from autopar.cost_models.comm import Collective, collective, collective_time

COUNT_BYTES = 8  # the count is summed in float64 (exact past float32's 2**24 targets)


def _counted(node: Node) -> list[int]:
    """Indices of the dims whose split needs the count, [] when the node needs none."""
    if not counts_targets(node):
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


def lead_seconds(node: Node, mesh: Mesh, cluster: Cluster) -> float:
    """The forward work the count overlaps, at its fastest: its FLOPs over every device of the
    mesh at the cluster's highest peak (0 where the graph recorded none)."""
    flops = node.attrs.get(LEAD_FLOPS, 0) if node.attrs else 0
    if not flops:
        return 0.0
    devices = math.prod(mesh.shape) if len(mesh.shape) else 1
    return flops / (devices * max(cluster.peak_flops.values()))


def exposed(node: Node, count: Collective, mesh: Mesh, cluster: Cluster) -> float:
    """Seconds of ``count`` the forward does not hide: ``max(0, all-reduce - lead)``."""
    return max(0.0, count.seconds - lead_seconds(node, mesh, cluster))


def loss_count_many(node: Node, own: np.ndarray, mesh: Mesh, cluster: Cluster) -> np.ndarray:
    """``exposed(node, loss_count(...), ...)`` for every config (rows of the owner matrix) at once."""
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
    return np.where(p > 1, np.maximum(0.0, t - lead_seconds(node, mesh, cluster)), 0.0)
