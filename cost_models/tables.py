"""Graph + cluster + config space + any cost model -> ``autopar.core.tables.CostTables``.

A cost model is any ``autopar.core.cost_model.CostModel``: ``node_cost``, ``edge_cost`` and
``output_cost`` fill the tables (``node_breakdown`` explains them to the report), ``units`` names
their unit.

A node's costs and configs are a pure function of its *signature* (everything but its name and
module), so the repeated layers of a deep model share one computed vector and one edge matrix:
the cache is exact, and the shared arrays are never written to (parallel edges are summed into a
new array).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autopar.core.cluster import Cluster
from autopar.core.cost_model import CostModel
from autopar.core.ir import Graph, Node, Operand
from autopar.core.tables import CostTables
from autopar.cost_models.analytic import AnalyticModel, check_mode
from autopar.cost_models.memory import already_saved, node_memory_vector, update_memory_vector
from autopar.core.space import Space, configs_for


def _operand_sig(op: Operand) -> tuple:
    kind = "param" if op.is_param else "input" if op.is_input else "node"
    return (kind, op.output, op.spec)


def signature(node: Node) -> tuple:
    """Everything a cost may depend on; two nodes with equal signatures cost the same."""
    return (node.op, node.target, node.dims, tuple(_operand_sig(o) for o in node.inputs),
            tuple((o.spec,) for o in node.params), node.outputs, node.flops, node.bytes_read,
            node.bytes_written, bool(node.unsupported), repr(sorted(node.attrs.items(), key=str)))


def make_model(model: Any) -> Any:
    if model is None or model == "analytic":
        return AnalyticModel()
    if isinstance(model, str):
        raise ValueError(f"build_tables knows the cost model 'analytic' by name; pass other "
                         f"models as objects (got {model!r})")
    return model


def build_tables(graph: Graph, cluster: Cluster, model: CostModel | str = "analytic", space: Space = "mesh",
                 mode: str = "train", optimizer: str | None = "adam") -> CostTables:
    """Cost tables of ``graph`` on ``cluster``: node costs, edge costs (parallel edges summed),
    per-device memory per config, the cluster's memory capacity, units of the model."""
    mode = check_mode(mode)
    model = make_model(model)
    mesh = cluster.mesh()
    sig_of = getattr(model, "signature", signature)
    # Signatures are big tuples whose hash Python recomputes at every lookup: number them once.
    sig_ids: dict[Any, int] = {}
    sigs = [sig_ids.setdefault(sig_of(n), len(sig_ids)) for n in graph.nodes]
    index = {n.name: i for i, n in enumerate(graph.nodes)}

    cfg_cache: dict[Any, list] = {}
    cost_cache: dict[Any, np.ndarray] = {}
    configs, node_cost = [], []
    for n, s in zip(graph.nodes, sigs):
        if s not in cfg_cache:
            cfg_cache[s] = configs_for(n, mesh, space)
            cost_cache[s] = np.asarray(model.node_cost(n, cfg_cache[s], cluster, mode), dtype=float)
        configs.append(cfg_cache[s])
        node_cost.append(cost_cache[s])

    out_cost = getattr(model, "output_cost", None)
    if out_cost is not None:
        for name, idx in graph.outputs:
            i = index.get(name)
            if i is not None:
                extra = np.asarray(out_cost(graph.nodes[i], idx, configs[i], cluster, mode))
                if extra.any():
                    node_cost[i] = node_cost[i] + extra

    edge_cache: dict[Any, np.ndarray] = {}
    edge_cost: dict[tuple[int, int], np.ndarray] = {}
    for e in graph.edges:
        u, v = index[e.src], index[e.dst]
        key = (sigs[u], e.src_output, sigs[v], e.dst_input)
        if key not in edge_cache:
            m = model.edge_cost(graph.nodes[u], e.src_output, graph.nodes[v], e.dst_input,
                                configs[u], configs[v], cluster, mode)
            edge_cache[key] = np.asarray(m, dtype=float)
        m = edge_cache[key]
        if u > v:
            u, v, m = v, u, m.T
        if u == v:  # a node reading its own output cannot happen in a DAG; keep the diagonal
            node_cost[u] = node_cost[u] + np.diag(m)
            continue
        edge_cost[(u, v)] = edge_cost[(u, v)] + m if (u, v) in edge_cost else m

    memory = []
    mem_cache: dict[Any, np.ndarray] = {}
    seen: set[str] = set()
    dup = already_saved(graph)
    for n, s, cfgs in zip(graph.nodes, sigs, configs):
        skip = frozenset(p.source for p in n.params if p.source in seen)
        skip_pos = tuple(i for i, p in enumerate(n.params) if p.source in skip)
        shared = dup.get(n.name, frozenset())
        key = (s, skip_pos, tuple(sorted(shared)))
        if key not in mem_cache:
            mem_cache[key] = node_memory_vector(n, cfgs, mesh, mode, optimizer, skip, shared)
        memory.append(mem_cache[key])
        seen.update(p.source for p in n.params)

    return CostTables(nodes=[n.name for n in graph.nodes], configs=configs, node_cost=node_cost,
                      edge_cost=edge_cost, memory=memory,
                      memory_capacity=float(cluster.memory_capacity),
                      units=getattr(model, "units", "s"))


def update_memory(graph: Graph, tables: CostTables, cluster: Cluster,
                  optimizer: str | None = "adam") -> list[np.ndarray] | None:
    """Per node and config of ``tables`` (built from ``graph`` for training), the bytes held
    while the optimizer's update runs (``memory.update_memory_vector``: parameters, gradients,
    optimizer state and the update's working set; a parameter read by several nodes counted at
    the first, as ``build_tables`` counts it). The step's peak is the larger of the sums of these
    and of ``tables.memory``. None where the update holds no working set (a fused update:
    ``Cluster.foreach_update`` False; an optimizer without second moments): it then holds a subset
    of what the backward holds, and ``tables.memory`` is the peak."""
    from autopar.cost_models.memory import optimizer_states
    from autopar.cost_models.training import update_working_set

    if not update_working_set(1.0, optimizer_states(optimizer), cluster.foreach_update):
        return None
    mesh = cluster.mesh()
    cache: dict[Any, np.ndarray] = {}
    seen: set[str] = set()
    out = []
    for n, cfgs in zip(graph.nodes, tables.configs):
        skip = frozenset(p.source for p in n.params if p.source in seen)
        key = (id(cfgs), signature(n), tuple(i for i, p in enumerate(n.params) if p.source in skip))
        if key not in cache:
            cache[key] = update_memory_vector(n, cfgs, mesh, optimizer, cluster.foreach_update, skip)
        out.append(cache[key])
        seen.update(p.source for p in n.params)
    return out
