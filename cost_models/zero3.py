"""ZeRO-3's gathered parameters on the flat path: each unit's whole parameter (and gradient)
bytes per config.

The per-node memory tables count a ZeRO-3 parameter as its shard (``training.param_bytes``);
what a rank holds whole at once on top (the root's parameters and two blocks',
``training.zero3_gathered``) is not a sum over nodes, so the flat path adds it to a plan's
total (``gathered``) and takes its least value over the configs off the capacity it searches
against (``least_gathered``), as the hierarchical path adds it to a stage's transient.
"""

from __future__ import annotations

import numpy as np

from autopar.core.blocks import block_path
from autopar.core.ir import trainable
from autopar.core.layout import owner_matrix, shard_factors
from autopar.core.strategy import node_training
from autopar.core.tables import CostTables, Mesh
from autopar.cost_models.training import zero3_gathered


def _vectors(graph, tables: CostTables, mesh: Mesh) -> list[tuple[str | None, int, np.ndarray]]:
    """(unit, node index, whole parameter and gradient bytes per config) of each ZeRO-3 node, a
    parameter at its first reader."""
    seen: set[str] = set()
    by_name = {n.name: n for n in graph.nodes}
    out = []
    for i, (name, configs) in enumerate(zip(tables.nodes, tables.configs)):
        node = by_name.get(name)
        if node is None or node_training(node).zero < 3:
            continue
        own, _ = owner_matrix(configs, mesh)
        vec = np.zeros(len(configs))
        for op, grad in zip(node.params, trainable(node)):
            if op.source in seen or not grad:
                continue
            seen.add(op.source)
            vec = vec + 2 * op.spec.nbytes / shard_factors(node, op.spec, own, mesh)  # parameter and gradient
        if np.any(vec):
            out.append((block_path(node.module), i, vec))
    return out


def _total(parts: list[tuple[str | None, float]]) -> float:
    units: dict[str | None, float] = {}
    for unit, b in parts:
        units[unit] = units.get(unit, 0.0) + b
    keys = list(units)
    return zero3_gathered([units[k] for k in keys], [k is None for k in keys])


def gathered(graph, tables: CostTables, choice: list[int], mesh: Mesh) -> float:
    """Bytes a ZeRO-3 plan holds whole on top of its tables' total (0 without ZeRO-3)."""
    return _total([(u, float(v[choice[i]])) for u, i, v in _vectors(graph, tables, mesh)])


def least_gathered(graph, tables: CostTables, mesh: Mesh) -> float:
    """The least of ``gathered`` over every choice of configs (each node's least)."""
    return _total([(u, float(np.min(v))) for u, _, v in _vectors(graph, tables, mesh)])
