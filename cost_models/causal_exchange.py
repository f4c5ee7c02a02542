"""The all-to-alls of a causal attention balanced over the ranks that split its query rows
(``codegen/causal_balance.py``, the rule ``core.sequence.balanced_causal``): in the forward the
queries go to the balanced layout and the outputs come back, in the backward the outputs' and
then the queries' gradients take the reverse ways; each moves one rank's local query (output)
rows, priced as an all-to-all over the mesh axes cutting ``l`` (c10d's all_to_all_single).

The attention's own FLOPs (``work_factor``): a contiguous split's rank calls the masked kernel
on its rows and every key, ``1 / c`` of the whole ``L x M`` count, on every rank alike; balanced,
each of a rank's two chunks reads only the keys up to its last row, ``(2c + 1) / (4c^2)`` of the
count on every rank, ``(2c + 1) / (4c)`` of the contiguous call's."""

from __future__ import annotations

import math

import numpy as np

from autopar.core.cluster import Cluster
from autopar.core.ir import Node
from autopar.core.sequence import balanced_causal
from autopar.core.tables import Config, Mesh
from autopar.cost_models.comm import all_to_alls, per_config


def work_factor(node: Node, splits) -> float:
    """The FLOPs of one rank's attention over its rows' share of the whole: ``(2c + 1) / (4c)``
    where it runs balanced over ``c`` ranks, else 1."""
    if node.op != "sdpa":
        return 1.0
    c = splits[[d.name for d in node.dims].index("l")]
    return (2 * c + 1) / (4 * c) if balanced_causal(node, c) else 1.0


def least_work_factor(node: Node) -> float:
    """A share of its FLOPs no split's ``work_factor`` goes below: ``1 / 2`` for a causal
    attention (run balanced over ``c`` ranks it is ``(2c + 1) / (4c)``, falling to it as ``c``
    grows), else 1. Lower bounds on compute count each node's FLOPs times this."""
    causal = node.op == "sdpa" and bool(node.attrs.get("is_causal") or node.attrs.get("mask"))
    return 0.5 if causal else 1.0


def balance_axes(node: Node, config: Config) -> tuple[int, ...]:
    """The mesh axes of the context group of a balanced causal attention; () where none runs."""
    if node.op != "sdpa" or not config.mesh_axes:
        return ()
    names = [d.name for d in node.dims]
    axes = tuple(config.mesh_axes[names.index("l")])
    return axes if balanced_causal(node, config.splits[names.index("l")]) else ()


def balance_steps(node: Node, config: Config, mode: str = "train") -> list[tuple[str, str, float]]:
    """``(phase, what, bytes per rank)`` of each all-to-all, in order; [] where none runs."""
    if not balance_axes(node, config):
        return []
    split = dict(zip((d.name for d in node.dims), config.splits))

    def local(spec) -> float:
        return spec.nbytes / math.prod(split.get(d, 1) for axis in spec.axes for d in axis)

    q, out = local(node.inputs[0].spec), local(node.outputs[0])
    steps = [("forward", "queries", q), ("forward", "outputs", out)]
    if mode == "train":
        steps += [("backward", "output gradients", out), ("backward", "query gradients", q)]
    return steps


def balance_seconds(node: Node, config: Config, mesh: Mesh, cluster: Cluster, mode: str = "train"
                    ) -> tuple[float, str]:
    """Seconds of the node's balancing all-to-alls per step (``config`` on the mesh) and their arithmetic."""
    steps = balance_steps(node, config, mode)
    if not steps:
        return 0.0, ""
    return all_to_alls(steps, balance_axes(node, config), mesh, cluster)


def balance_many(node: Node, configs: list[Config], mesh: Mesh, cluster: Cluster, mode: str = "train") -> np.ndarray:
    """``balance_seconds`` for every config (zeros for nodes that are not causal attention)."""
    if node.op != "sdpa":
        return np.zeros(len(configs))
    return per_config(balance_seconds, node, configs, mesh, cluster, mode)
