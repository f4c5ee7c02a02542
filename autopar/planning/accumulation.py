"""Gradient accumulation on the flat path: a step of ``k`` microbatches priced from the graph at
microbatch size.

A step runs the microbatch's forward and backward ``k`` times (its compute, tensor-parallel
communication and reshards: every node's time per microbatch, every edge's) and synchronizes the
gradients and steps the optimizer once (each node's terms of kind "sync" and "optimizer", from
the cost model's own ``node_breakdown``). So node ``i`` under config ``c`` costs
``k * t_i(c) - (k - 1) * s_i(c)``, ``t_i`` its microbatch tables' cost and ``s_i`` its once-per-
step part; edges cost ``k`` times theirs; the ``k - 1`` later microbatches add their gradients
into the held ones (``training.accumulation_time``). Memory is the microbatch graph's: one
microbatch's activations, the parameters, gradients and optimizer state whole.

Gradient accumulation is searched with ZeRO 0 and 1 only: codegen (``codegen/accumulate.py``)
reduces the gradients once after the last microbatch, so each rank holds the whole gradient
through the step (ZeRO-2/3 would reduce-scatter once per microbatch).
"""

from __future__ import annotations

import numpy as np

from autopar.core.batch import scale_batch
from autopar.core.ir import Graph
from autopar.core.tables import CostTables
from autopar.cost_models.tables import signature

STEPS = (2, 4)  # microbatches per step searched (each only where the next fewer does not fit)
ONCE = ("sync", "optimizer")  # the kinds of cost term paid once per step


def steps(accumulate, batch: int, zero="auto") -> int:
    """The microbatches a step asked for (0 for "auto": searched); ValueError in one line for a
    count that is not one, does not divide the batch, or comes with ZeRO-2/3."""
    if accumulate == "auto":
        return 0
    k = int(accumulate) if str(accumulate).isdigit() else 0
    if k < 1:
        raise ValueError(f"accumulate={accumulate!r}: gradient accumulation takes a count of microbatches >= 1 "
                         "(or 'auto')")
    if batch % k:
        raise ValueError(f"accumulate={k}: the batch of {batch} does not split into {k} equal microbatches; "
                         "take a divisor of the batch")
    if k > 1 and zero not in ("auto", 0, 1, "0", "1"):  # one microbatch a step: no accumulation
        raise ValueError(f"accumulate={k} runs with ZeRO 0 or 1 (the gradients are reduced once, after the last "
                         f"microbatch), not zero={zero}")
    return k


def microbatch_graph(graph: Graph, k: int) -> Graph | None:
    """The graph at 1/k of its batch; None when ``k`` does not divide the batch."""
    try:
        return scale_batch(graph, k)
    except ValueError:
        return None


def once_per_step(graph: Graph, tables: CostTables, model, cluster, mode: str) -> list[np.ndarray]:
    """Per node and config, the seconds of its cost paid once per step (gradient sync, optimizer
    update); nodes of one signature share their configs list (``build_tables``) and an array."""
    cache: dict[tuple, np.ndarray] = {}
    out = []
    for node, configs in zip(graph.nodes, tables.configs):
        if not node.params:
            out.append(np.zeros(len(configs)))
            continue
        key = (id(configs), getattr(model, "signature", signature)(node))
        if key not in cache:
            cache[key] = np.array([sum(t.seconds for t in model.node_breakdown(node, c, cluster, mode, text=False).terms
                                       if t.kind in ONCE) for c in configs])
        out.append(cache[key])
    return out


def added_gradients(graph: Graph, tables: CostTables, k: int, cluster, mode: str) -> list[np.ndarray]:
    """Per node and config, the seconds a step of ``k`` microbatches spends adding the later
    microbatches' gradients into the held ones (``training.accumulation_time`` over the node's
    gradient bytes per device, ``memory.node_memory``), ``k`` times its per-microbatch figure."""
    from autopar.cost_models.memory import node_memory
    from autopar.cost_models.training import accumulation_time

    mesh = cluster.mesh()
    cache: dict[tuple, np.ndarray] = {}
    out = []
    for node, configs in zip(graph.nodes, tables.configs):
        if not node.params or mode != "train":
            out.append(np.zeros(len(configs)))
            continue
        key = (id(configs), signature(node))
        if key not in cache:
            grads = np.array([node_memory(node, c, mesh, mode).grads for c in configs])
            cache[key] = k * accumulation_time(grads, k, cluster.memory_bandwidth)
        out.append(cache[key])
    return out


def accumulated_tables(graph: Graph, tables: CostTables, k: int, model, cluster, mode: str) -> CostTables:
    """``tables`` (of ``graph``, the microbatch graph) priced as a step of ``k`` microbatches:
    ``k`` times each microbatch's work, the once-per-step part once, and ``k - 1`` additions of a
    microbatch's gradients into the held ones (``added_gradients``)."""
    once = once_per_step(graph, tables, model, cluster, mode)
    added = added_gradients(graph, tables, k, cluster, mode)
    cost = [k * np.asarray(c, dtype=float) - (k - 1) * s + a for c, s, a in zip(tables.node_cost, once, added)]
    edges = {e: k * np.asarray(m, dtype=float) for e, m in tables.edge_cost.items()}
    return CostTables(tables.nodes, tables.configs, cost, edges, tables.memory, tables.memory_capacity, tables.units)
