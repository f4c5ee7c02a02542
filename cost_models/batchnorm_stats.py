"""The forward all-reduces of a training batch norm whose batch dim is split (two per step:
the per-channel mean, then the variance), priced for one config or for every config at once."""

from __future__ import annotations

import math

import numpy as np

from autopar.core.cluster import Cluster
from autopar.core.ir import Node
from autopar.core.tables import Config, Mesh
from autopar.cost_models.comm import Collective, collective, collective_time


def bn_stats(node: Node, cfg: Config, mesh: Mesh, cluster: Cluster) -> Collective | None:
    """One of the two forward all-reduces of a training batch norm whose batch dim is split.

    ``codegen/batchnorm.py`` makes the statistics global: the per-channel mean and then the mean
    of squared deviations, each a ``Partial -> Replicate`` of ``C / channel splits`` numbers over
    the mesh axes that cut the batch dim (``dims[0]``; channels are ``dims[1]``). Their backward
    is ``Replicate -> Partial``: free. ``None`` when the node is no batch norm or its batch is
    whole. ``cfg`` is mapped onto the mesh; the caller prices it twice, in training only.
    """
    if node.op != "batch_norm" or not node.inputs or len(node.dims) < 2 or not cfg.mesh_axes:
        return None
    batch = cfg.mesh_axes[0]
    if not batch:
        return None
    spec = node.inputs[0].spec
    channel_split = math.prod(mesh.shape[a] for a in cfg.mesh_axes[1])
    c = collective("all-reduce", spec.shape[1] * spec.itemsize / channel_split, batch, mesh,
                   cluster)
    return c if c.p > 1 else None


def bn_stats_many(node: Node, own: np.ndarray, mesh: Mesh, cluster: Cluster) -> np.ndarray:
    """``2 * bn_stats(...).seconds`` for every config (rows of the owner matrix) at once."""
    if node.op != "batch_norm" or not node.inputs or len(node.dims) < 2 or not len(mesh.shape):
        return np.zeros(len(own))
    spec = node.inputs[0].spec
    sizes = np.asarray(mesh.shape, dtype=float)
    level = np.asarray(mesh.level or (0,) * len(mesh.shape)) > 0
    batch = own == 0
    p = np.prod(np.where(batch, sizes, 1.0), axis=1)
    nbytes = spec.shape[1] * spec.itemsize / np.prod(np.where(own == 1, sizes, 1.0), axis=1)
    cross = (batch & level).any(axis=1)
    bw = np.where(cross, cluster.inter_bandwidth, cluster.intra_bandwidth)
    lat = np.where(cross, cluster.inter_latency, cluster.intra_latency)
    return 2.0 * collective_time("all-reduce", nbytes, p, bw, lat, cluster.call_latency)
