"""Pricing pipeline options for ``search.pipeline``: the planner side of inter-operator search.

For every stage count S that splits off the outer mesh axes (so each stage is a sub-mesh made of
the inner axes, the same shape the intra-operator space already knows) and every microbatch count
M in {S, 2S, 4S} that divides the batch, the graph at microbatch size is priced on one stage's
devices and solved exactly by the intra-operator DP. Each node's stage-local time is read off that
solution (its cost plus the resharding of its inputs), its gradient synchronization is taken out
as a once-per-step term, and its memory is split into static (parameters, gradients, optimizer
state) and per-microbatch activations. ``search.pipeline`` then cuts the node sequence into stages.

Each option is priced by the plan's own cost model (analytic or profiled). Approximation, stated: a stage's intra-operator plan is the restriction of the whole-graph optimum
on the stage's devices, not re-optimized per stage; for a chain of identical blocks the two agree
except at the few nodes next to a cut.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autopar.core.batch import scale_batch
from autopar.core.cluster import Cluster
from autopar.core.ir import Graph
from autopar.search.pipeline import PipelineSolution, StageCosts, search
from autopar.core.tables import Config, CostTables


@dataclass
class PipelineOption:
    costs: StageCosts
    graph: Graph  # the graph at microbatch size
    tables: CostTables  # priced on one stage's devices
    choice: list[int]
    stage_axes: int  # how many outer mesh axes the stages take


def _batch_size(graph: Graph) -> int | None:
    for spec in graph.inputs.values():
        if spec.shape:
            return spec.shape[0]
    return None


def stage_counts(cluster: Cluster) -> list[tuple[int, int]]:
    """(stage count, number of outer mesh axes it takes), for stage groups that are inner sub-meshes."""
    mesh = cluster.mesh()
    out, prod = [], 1
    for a, size in enumerate(mesh.shape[:-1]):
        prod *= size
        sub = cluster.with_devices(cluster.devices // prod)
        if sub.mesh().shape == mesh.shape[a + 1:]:
            out.append((prod, a + 1))
    return out


def price_options(graph: Graph, cluster: Cluster, mode: str, optimizer, solve, model,
                  max_stages: int = 16) -> list[PipelineOption]:
    """``model``: the plan's own cost model, so a stage is priced as the single-stage plan is."""
    from autopar.cost_models.memory import node_memory
    from autopar.cost_models.tables import build_tables

    batch = _batch_size(graph)
    options = []
    for stages, axes in stage_counts(cluster):
        if stages > max_stages or stages > len(graph.nodes):
            continue
        sub = cluster.with_devices(cluster.devices // stages)
        mesh = sub.mesh()
        for micro in (stages, 2 * stages, 4 * stages):
            if batch is None or batch % micro:
                continue
            try:
                g = scale_batch(graph, micro)
            except ValueError:
                continue
            t = build_tables(g, sub, model, space="mesh", mode=mode, optimizer=optimizer)
            t.memory_capacity = math.inf
            choice = solve(t).choice
            n = len(t.nodes)
            time = np.array([float(t.node_cost[i][choice[i]]) for i in range(n)])
            for (u, v), m in t.edge_cost.items():
                time[v] += float(m[choice[u], choice[v]])
            sync = np.zeros(n)
            static = np.zeros(n)
            acts = np.zeros(n)
            # Nodes of one signature share one config list (build_tables' cache) and price alike,
            # so each (config list, chosen config) is priced once.
            seen: dict[tuple[int, int], tuple[float, float, float]] = {}
            for i, node in enumerate(g.nodes):
                key = (id(t.configs[i]), choice[i])
                if key not in seen:
                    cfg = t.configs[i][choice[i]]
                    s = 0.0
                    if node.params:
                        nc = model.node_breakdown(node, cfg, sub, mode, text=False)
                        s = sum(term.seconds for term in nc.terms if term.kind in ("sync", "optimizer"))
                    mb = node_memory(node, cfg, mesh, mode, optimizer)
                    seen[key] = (s, mb.params + mb.grads + mb.optimizer, mb.activations)
                sync[i], static[i], acts[i] = seen[key]
            time -= sync  # the per-microbatch part; sync happens once per step
            cut = cut_times(g, sub, cluster, stages)
            options.append(PipelineOption(StageCosts(sub.devices, micro, time, sync, static, acts, cut),
                                          g, t, choice, axes))
    return options


def cut_times(graph: Graph, stage: Cluster, cluster: Cluster, stages: int) -> np.ndarray:
    """Per-microbatch time to send what crosses a cut after each position, forward and backward.

    Each device of a stage sends its 1/devices share of every crossing tensor to its peer in the
    next stage (the layouts agree across stages; a reshard inside the stage is priced as an edge).
    """
    pos = {n.name: i for i, n in enumerate(graph.nodes)}
    n = len(graph.nodes)
    diff = np.zeros(n + 1)
    for node in graph.nodes:
        for op in node.inputs:
            if op.is_node:
                a, b = pos[op.source], pos[node.name]
                if b > a:  # crosses every cut after a and before b
                    diff[a] += op.spec.nbytes
                    diff[b] -= op.spec.nbytes
    crossing = np.cumsum(diff)[: n - 1]
    crosses_nodes = stage.devices >= cluster.devices_per_node and cluster.nodes > 1
    bw, lat = cluster.link(crosses_nodes)
    per_device = crossing / stage.devices
    return np.where(crossing > 0, 2 * (lat + per_device / bw), 0.0)


def best_pipeline(graph, cluster, mode, optimizer, capacity, solve, model
                  ) -> tuple[PipelineSolution, PipelineOption] | None:
    options = price_options(graph, cluster, mode, optimizer, solve, model)
    best = search([o.costs for o in options], cluster.devices, capacity)
    if best is None:
        return None
    option = next(o for o in options if o.costs.devices == best.devices and o.costs.microbatches == best.microbatches)
    return best, option


def stage_assignment(option: PipelineOption, graph: Graph) -> dict[str, Config]:
    """The stage configs on the full mesh: the stage mesh's axes follow the stage axes."""
    out = {}
    for i, node in enumerate(graph.nodes):
        c = option.tables.configs[i][option.choice[i]]
        shifted = tuple(tuple(a + option.stage_axes for a in axes) for axes in c.mesh_axes)
        out[node.name] = Config(c.splits, shifted)
    return out


__all__ = ["PipelineOption", "best_pipeline", "stage_assignment", "stage_counts"]
