"""The token exchange of expert parallelism: an all-to-all each way, forward and backward.

A ``moe_experts`` node whose expert dim is cut over a group of mesh axes sends each of its local
routed rows (``tokens x top-k`` of them, ``h`` features each) to the rank holding that row's
expert and takes the results back: one all-to-all to dispatch, one to combine, and the same two
again in the backward (the gradients travel the opposite way). Per rank and per all-to-all:
``N = t_local * k * h * itemsize`` bytes, of which ``(p-1)/p`` leave the rank under uniform
routing (the assumption the split's compute price makes too: each expert receives ``t * k / e``
rows; a skewed router sends more to some ranks and makes them the step's critical path).
"""

from __future__ import annotations

import numpy as np

from autopar.cost_models.alpha_beta import FORMULA, collective_time
from autopar.cost_models.comm import group_of
from autopar.core.cluster import Cluster
from autopar.core.ir import Node
from autopar.core.layout import to_mesh
from autopar.core.tables import Config, Mesh

EXCHANGES = {"train": 4, "inference": 2}  # dispatch + combine, forward (and backward)


def exchange_bytes(node: Node, config: Config, mesh: Mesh) -> tuple[float, tuple[int, ...]]:
    """(bytes one rank sends in one all-to-all, the mesh axes of its group); (0, ()) unsplit."""
    if node.op != "moe_experts" or not config.mesh_axes:
        return 0.0, ()
    names = [d.name for d in node.dims]
    axes = tuple(config.mesh_axes[names.index("experts")])
    if not axes:
        return 0.0, ()
    spec = node.inputs[0].spec  # hidden [t, h]
    tokens, hidden = spec.shape
    local = tokens / (config.splits[names.index("tokens")] * config.splits[names.index("experts")])
    return local * int(node.attrs.get("top_k", 1)) * hidden * spec.itemsize, axes


def exchange_seconds(node: Node, config: Config, mesh: Mesh, cluster: Cluster, mode: str = "train") -> tuple[float, str]:
    """Seconds of the node's all-to-alls per step and the arithmetic behind them."""
    nbytes, axes = exchange_bytes(node, config, mesh)
    if not axes:
        return 0.0, ""
    p, cross = group_of(axes, mesh)
    bw, lat = cluster.kind_link("all-to-all", *cluster.link(cross))
    one = collective_time("all-to-all", nbytes, p, bw, lat, cluster.call_latency)
    n = EXCHANGES[mode]
    text = (f"{n} all-to-alls (dispatch, combine{', and their gradients' if n == 4 else ''}) of N = "
            f"{nbytes:.6g} B per rank over mesh axes {list(axes)} (p={p}): {FORMULA['all-to-all']} = "
            f"{one:.4g} s each, uniform routing assumed")
    return n * one, text


def exchange_many(node: Node, configs: list[Config], mesh: Mesh, cluster: Cluster, mode: str = "train") -> np.ndarray:
    """``exchange_seconds`` for every config (zeros for nodes that are not experts)."""
    if node.op != "moe_experts":
        return np.zeros(len(configs))
    out = np.zeros(len(configs))
    for i, c in enumerate(configs):
        m = to_mesh(c, mesh)
        if m is not None:
            out[i] = exchange_seconds(node, m, mesh, cluster, mode)[0]
    return out


