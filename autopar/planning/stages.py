"""Pricing pipeline options for ``search.pipeline``: the planner side of inter-operator search.

For every stage count S that splits off the outer mesh axes (so each stage is a sub-mesh made of
the inner axes, the same shape the intra-operator space already knows) and every microbatch count
M in {S, 2S, 4S} that divides the batch, the graph at microbatch size is priced on one stage's
devices and solved exactly by the intra-operator DP. Each node's stage-local time is read off that
solution (its cost plus the resharding of its inputs, plus adding its gradients into the held
ones for every microbatch after the first: ``training.accumulation_time``), its gradient
synchronization is taken out as a once-per-step term, and its memory is split into static (parameters, gradients, optimizer
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
from autopar.search.pipeline import FLAT_SCHEDULES, PipelineSolution, StageCosts, search
from autopar.core.tables import Config, CostTables


@dataclass
class PipelineOption:
    costs: StageCosts
    graph: Graph  # the graph at microbatch size
    tables: CostTables  # priced on one stage's devices
    choice: list[int]
    stage_axes: int  # how many outer mesh axes the stages take
    accumulate: np.ndarray | None = None  # per node, per microbatch: its gradients added into the held ones


def batch_size_of(graph: Graph) -> int | None:
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


def option_specs(graph: Graph, cluster: Cluster, max_stages: int = 16) -> list[tuple[int, int, int]]:
    """(stage count, outer mesh axes it takes, microbatch count) of every option, in pricing order."""
    batch = batch_size_of(graph)
    out = []
    for stages, axes in stage_counts(cluster):
        if stages > max_stages or stages > len(graph.nodes):
            continue
        for micro in (stages, 2 * stages, 4 * stages):
            if batch is not None and batch % micro == 0:
                out.append((stages, axes, micro))
    return out


def price_options(graph: Graph, cluster: Cluster, mode: str, optimizer, solve, model,
                  max_stages: int = 16) -> list[PipelineOption]:
    """``model``: the plan's own cost model, so a stage is priced as the single-stage plan is."""
    out = []
    for stages, axes, micro in option_specs(graph, cluster, max_stages):
        option = price_option(graph, cluster, stages, axes, micro, mode, optimizer, solve, model)
        if option is not None:
            out.append(option)
    return out


def price_option(graph: Graph, cluster: Cluster, stages: int, axes: int, micro: int, mode: str, optimizer,
                 solve, model, g: Graph | None = None) -> PipelineOption | None:
    """One option priced: the graph at microbatch size (``g``, when the caller has it) on one
    stage's devices, solved exactly; None when the batch does not scale to that microbatch."""
    from autopar.cost_models.memory import already_saved, node_memory
    from autopar.cost_models.tables import build_tables
    from autopar.cost_models.training import accumulation_time

    sub = cluster.with_devices(cluster.devices // stages)
    mesh = sub.mesh()
    if g is None:
        try:
            g = scale_batch(graph, micro)
        except ValueError:
            return None
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
    grads = np.zeros(n)
    # Nodes of one signature share one config list (build_tables' cache) and price alike,
    # so each (config list, chosen config) is priced once.
    seen: dict[tuple[int, int], tuple[float, float, float, float]] = {}
    dup = already_saved(g)
    for i, node in enumerate(g.nodes):
        key = (id(t.configs[i]), choice[i], dup.get(node.name))
        if key not in seen:
            cfg = t.configs[i][choice[i]]
            s = 0.0
            if node.params:
                nc = model.node_breakdown(node, cfg, sub, mode, text=False)
                s = sum(term.seconds for term in nc.terms if term.kind in ("sync", "optimizer"))
            mb = node_memory(node, cfg, mesh, mode, optimizer, shared=dup.get(node.name, frozenset()))
            seen[key] = (s, mb.params + mb.grads + mb.optimizer + mb.transient, mb.activations, mb.grads)
        sync[i], static[i], acts[i], grads[i] = seen[key]
    time -= sync  # the per-microbatch part; sync happens once per step
    added = accumulation_time(grads, micro, cluster.memory_bandwidth)  # into the held gradients
    time += added
    cut = cut_times(g, sub, cluster, stages)
    return PipelineOption(StageCosts(sub.devices, micro, time, sync, static, acts, cut), g, t, choice, axes,
                          added)


def step_lower_bound(g: Graph, cluster: Cluster, stages: int, micro: int, mode: str, model) -> float:
    """A lower bound on the step time of any pipeline of this option, from node costs alone.

    A step takes ``k * t_max + sync_max`` (k = M + S - 1, ``search.pipeline``); the slowest stage
    takes at least 1/S of the per-microbatch time of all nodes and the slowest sync at least 1/S
    of all syncs, and edges, cuts and output reductions only add time, so
    ``step >= sum_i min_c (k * t_i(c) + s_i(c)) / S`` with t_i the node's per-microbatch time and
    s_i its once-per-step terms (gradient sync, optimizer update) under config c on a stage's
    devices. The analytic model gives t_i with its sync weight and optimizer off; for any other
    model the bound is 0 (nothing is pruned)."""
    import dataclasses

    from autopar.core.space import configs_for
    from autopar.cost_models.analytic import AnalyticModel
    from autopar.cost_models.tables import signature

    kind = type(model)
    if (mode != "train" or not isinstance(model, AnalyticModel) or model.sync_scale != 1.0
            or kind.node_cost is not AnalyticModel.node_cost
            or kind.node_breakdown is not AnalyticModel.node_breakdown):
        return 0.0
    per_microbatch = dataclasses.replace(model, sync_scale=0.0, optimizer=None)
    sub = cluster.with_devices(cluster.devices // stages)
    mesh = sub.mesh()
    k = micro + stages - 1
    least: dict[tuple, float] = {}
    total = 0.0
    for node in g.nodes:
        sig = signature(node)
        if sig not in least:
            configs = configs_for(node, mesh, "mesh")
            full = np.asarray(model.node_cost(node, configs, sub, mode), dtype=float)
            t = np.asarray(per_microbatch.node_cost(node, configs, sub, mode), dtype=float)
            # configs a model rules out (inf) are never chosen
            least[sig] = float(np.min(np.where(np.isfinite(full), k * t + (full - t), np.inf)))
        total += least[sig]
    return total / stages


# Bounds and costs are sums taken in different orders: prune only clearly above.
PRUNE_RTOL = 1e-9


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
    return np.where(crossing > 0, 2 * (lat + cluster.call_latency + per_device / bw), 0.0)


def best_pipeline(graph, cluster, mode, optimizer, capacity, solve, model, bound: float = math.inf,
                  prune: bool = True) -> tuple[PipelineSolution, PipelineOption] | None:
    """The best pipeline over the options (``search.pipeline.search``'s answer), or None.

    ``bound``: the caller takes a pipeline only when it is cheaper than this (the single-stage
    plan's cost), so an option whose ``step_lower_bound`` is above the bound, or above the best
    pipeline already found, is never solved: options are solved in order of their bounds, and
    the answer is the same as without pruning (``prune=False``), ties included, since an option
    that could tie the best is never pruned and the best is picked over the solved options in the
    unpruned order."""
    specs = option_specs(graph, cluster)
    graphs, bounds = [], []
    for stages, _, micro in specs:
        try:
            g = scale_batch(graph, micro)
        except ValueError:
            g = None
        graphs.append(g)
        bounds.append(step_lower_bound(g, cluster, stages, micro, mode, model) if g is not None and prune else 0.0)
    found: dict[int, tuple[PipelineSolution, PipelineOption]] = {}
    best = bound
    for j in sorted(range(len(specs)), key=lambda j: bounds[j]):
        if graphs[j] is None or (prune and bounds[j] > best * (1 + PRUNE_RTOL)):
            continue
        stages, axes, micro = specs[j]
        option = price_option(graph, cluster, stages, axes, micro, mode, optimizer, solve, model, graphs[j])
        sol = search([option.costs], cluster.devices, capacity, FLAT_SCHEDULES)
        if sol is not None:
            found[j] = (sol, option)
            best = min(best, sol.cost)
    winner = None
    for j in sorted(found):  # the unpruned search's order and tie rule
        sol = found[j][0]
        if winner is None or (sol.cost, max(sol.memory)) < (winner[0].cost, max(winner[0].memory)):
            winner = found[j]
    return winner


def stage_assignment(option: PipelineOption, graph: Graph) -> dict[str, Config]:
    """The stage configs on the full mesh: the stage mesh's axes follow the stage axes."""
    out = {}
    for i, node in enumerate(graph.nodes):
        c = option.tables.configs[i][option.choice[i]]
        shifted = tuple(tuple(a + option.stage_axes for a in axes) for axes in c.mesh_axes)
        out[node.name] = Config(c.splits, shifted)
    return out


__all__ = ["PipelineOption", "best_pipeline", "price_options", "stage_assignment", "stage_counts",
           "step_lower_bound"]
