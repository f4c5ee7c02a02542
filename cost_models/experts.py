"""The token exchange of expert parallelism: an all-to-all each way, forward and backward.

A ``moe_experts`` node whose expert dim is cut over a group of mesh axes sends each of its local
routed rows (``tokens x top-k`` of them, ``h`` features each) to the rank holding that row's
expert and takes the results back: one all-to-all to dispatch, one to combine, and the same two
again in the backward (the gradients travel the opposite way); before the dispatch, the row
counts (``p`` integers) and the rows' expert ids (one int64 a row) travel too. Per rank, a
dispatch or combine sends ``N = t_local * k * h * itemsize`` bytes, of which ``(p-1)/p`` leave the rank under uniform
routing (the assumption the split's compute price makes too: each expert receives ``t * k / e``
rows; a skewed router sends more to some ranks and makes them the step's critical path).
"""

from __future__ import annotations

import numpy as np

from autopar.cost_models.comm import all_to_alls, group_of, per_config
from autopar.core.cluster import Cluster
from autopar.core.ir import Node
from autopar.core.tables import Config, Mesh



def exchanges(node: Node, config: Config, mesh: Mesh, mode: str = "train") -> list[tuple[str, str, float]]:
    """``(phase, what, bytes per rank)`` of every all-to-all the node runs in a step, in order:
    forward, the row counts (``p`` integers), the rows' expert ids, the rows (dispatch) and their
    results (combine); backward, the results' and the rows' gradients. [] unsplit by experts."""
    nbytes, axes = exchange_bytes(node, config, mesh)
    if not axes:
        return []
    p = group_of(axes, mesh)[0]
    spec = node.inputs[0].spec
    ids = nbytes / (spec.shape[1] * spec.itemsize) * 8  # one int64 per row
    out = [("forward", "row counts", 8.0 * p), ("forward", "expert ids", ids), ("forward", "dispatch", nbytes),
           ("forward", "combine", nbytes)]
    if mode == "train":
        out += [("backward", "combine gradient", nbytes), ("backward", "dispatch gradient", nbytes)]
    return out


def exchange_axes(node: Node, config: Config, mesh: Mesh) -> tuple[int, ...]:
    return exchange_bytes(node, config, mesh)[1]


def exchange_bytes(node: Node, config: Config, mesh: Mesh) -> tuple[float, tuple[int, ...]]:
    """(bytes of rows one rank sends in one dispatch, the mesh axes of its group); (0, ()) unsplit."""
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


# the exchanges codegen issues right after another all-to-all, with no compute between (the rows
# and their expert ids follow the row counts): no rank has drifted from its peers since, so a fit
# of collectives after a step's compute (``collective_fit``) prices them high
BACK_TO_BACK = ("expert ids", "dispatch")


def exchange_seconds(node: Node, config: Config, mesh: Mesh, cluster: Cluster, mode: str = "train",
                     near: Cluster | None = None) -> tuple[float, str]:
    """Seconds of the node's all-to-alls per step and the arithmetic behind them. ``near``: the
    links of collectives that follow another with no compute between (a profiled model's fit
    after a short gap), for the ``BACK_TO_BACK`` exchanges; None: ``cluster``'s for all."""
    steps = exchanges(node, config, mesh, mode)
    if not steps:
        return 0.0, ""
    seconds, text = all_to_alls(steps, exchange_axes(node, config, mesh), mesh, cluster, near, BACK_TO_BACK)
    return seconds, (text + ("; the expert ids and the dispatch on the links after no compute" if near is not None
                             else "") + "; uniform routing assumed")


def exchange_many(node: Node, configs: list[Config], mesh: Mesh, cluster: Cluster, mode: str = "train") -> np.ndarray:
    """``exchange_seconds`` for every config (zeros for nodes that are not experts)."""
    if node.op != "moe_experts":
        return np.zeros(len(configs))
    return per_config(exchange_seconds, node, configs, mesh, cluster, mode)
