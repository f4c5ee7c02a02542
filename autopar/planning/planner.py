"""``autopar.plan``: trace -> cost tables -> search -> Plan, with the baselines priced alike.

This is the only place that knows both a cost model and a search: it hands the tables from one to
the other. Baselines are restrictions of the same tables (``autopar.core.tables.restrict``), so every
number in a plan and its baselines comes from one cost model and is directly comparable.
"""

from __future__ import annotations

import dataclasses
import math
import time
import numpy as np

from autopar.core.batch import batch_dims
from autopar.core.cluster import Cluster
from autopar.core.errors import InfeasibleError
from autopar.core.fingerprint import fingerprint
from autopar.core.ir import Graph
from autopar.planning.plan import Plan, SearchInfo
from autopar.core.tables import CostTables, Solution, restrict

SEARCHES = ("auto", "dp", "ilp", "brute")
# What a pipelined plan is (autopar/pipeline_plan.py): not an optimum over stages x splits.
PIPELINE_HEURISTIC = ("stage cuts exact for the given per-stage plans; each stage's splits are the "
                      "whole graph's optimum at the microbatch size, not re-optimized per stage")
COST_MODELS = ("analytic", "pase", "profiled")


def resolve_cluster(cluster) -> Cluster:
    if isinstance(cluster, Cluster):
        return cluster
    if isinstance(cluster, str):
        return Cluster.preset(cluster)
    if isinstance(cluster, int) and not isinstance(cluster, bool):
        return Cluster(devices=cluster)
    raise ValueError(f"cluster must be an autopar.Cluster, a preset name or a device count, not {cluster!r}")


def parse_space(space: str) -> tuple[str, int]:
    """'mesh' -> ('mesh', 0); 'pase' -> ('pase', 4); 'pase:N' -> ('pase', N)."""
    if space == "mesh":
        return "mesh", 0
    if space == "pase":
        return "pase", 4
    if space.startswith("pase:") and space[5:].isdigit() and int(space[5:]) >= 1:
        return "pase", int(space[5:])
    raise ValueError(f"unknown space {space!r}; use 'mesh', 'pase' (cutoff 4) or 'pase:N'")


def run_search(tables: CostTables, search: str, time_limit: float, whole: frozenset[str] = frozenset()) -> Solution:
    """The search on ``tables`` with the nodes named in ``whole`` fixed to their replicated config.

    ``whole``: cheap values many layers read (``autopar.planning.whole.kept_whole``: masks, position
    tables); fixed, they no longer tie the layers together in the exact search, and every node left
    with one config is folded into its neighbours' costs (exact). The solution says in ``detail``
    that it is optimal among plans that keep them whole. Without such nodes the tables are searched
    as they are."""
    from autopar.planning.whole import fix_and_fold, replicated_index

    fixed = {i: replicated_index(tables, i) for i, name in enumerate(tables.nodes)
             if name in whole and len(tables.configs[i]) > 1}
    if not fixed:  # nothing to keep whole: the tables as they are (the same optimum, the same ties)
        return _search(tables, search, time_limit)
    sol = _search(fix_and_fold(tables, fixed), search, time_limit)
    sol.choice = [fixed.get(i, c) for i, c in enumerate(sol.choice)]
    sol.detail = f"among plans that keep {len(fixed)} values read by many layers (masks, position tables) whole"
    return sol


def _search(tables: CostTables, search: str, time_limit: float) -> Solution:
    from autopar.search.common import SearchTooLargeError
    from autopar.search.dp import dp
    from autopar.search.ilp import ilp

    if search == "brute":
        from autopar.search.brute import brute

        return brute(tables)
    if search == "ilp":
        return ilp(tables, time_limit=time_limit)
    try:
        return dp(tables, ilp_time_limit=time_limit)
    except SearchTooLargeError:
        if search == "dp":
            raise
        return ilp(tables, time_limit=time_limit)


def plan(model, example_inputs=(), cluster=8, *, example_kwargs=None, cost_model: str = "analytic", space: str = "mesh",
         search: str = "auto", mode: str = "train", optimizer: str | None = "adam",
         memory_capacity: float | None = None, time_limit: float = 60.0, graph: Graph | None = None,
         model_name: str = "", pase_profile: str | None = None, pase_rate: tuple[float, float] = (10.0, 16.0),
         baselines: bool = True, pipeline: bool | str = "auto") -> Plan:
    """Find the best strategy for ``model`` on ``cluster`` under ``cost_model``; see DESIGN.md.

    ``example_inputs``/``example_kwargs``: the call, as ``autopar.trace`` takes it (positional inputs,
    keyword inputs, or one dict of keyword inputs).
    ``cluster``: an ``autopar.Cluster``, a preset name (``"8xA100"``) or a device count.
    ``memory_capacity`` (bytes per device) overrides the cluster's. ``search``: auto, dp, ilp, brute.
    ``cost_model="pase"`` uses PaSE's model (``pase_rate`` = its TFLOP/s and GB/s) on PaSE's view of
    the graph, with ``space="pase"``/``"pase:N"``; ``pase_profile`` names the per-model fold rules
    (default: the model class's name when PaSE has a profile for it).
    ``pipeline``: True searches pipeline stages too, False never; "auto" searches them when the
    cluster has several nodes or no single-stage plan fits, and a pipeline is taken only when it is
    predicted faster or is the only plan that fits.
    """
    if pipeline not in (True, False, "auto"):
        raise ValueError(f"pipeline must be True, False or 'auto', not {pipeline!r}")
    if search not in SEARCHES:
        raise ValueError(f"unknown search {search!r}; use one of {', '.join(SEARCHES)}")
    if cost_model not in COST_MODELS:
        raise ValueError(f"unknown cost model {cost_model!r}; use one of {', '.join(COST_MODELS)}")
    if memory_capacity is not None and not (memory_capacity > 0):  # also refuses NaN
        raise ValueError(f"memory_capacity is bytes per device and must be > 0, not {memory_capacity!r}")
    if not (time_limit > 0):
        raise ValueError(f"time_limit is the solver's limit in seconds and must be > 0, not {time_limit!r}")
    space_kind, cutoff = parse_space(space)
    if (cost_model == "pase") != (space_kind == "pase"):
        raise ValueError("cost_model='pase' goes with space='pase' or 'pase:N' (and only with it)")
    cluster = resolve_cluster(cluster)
    if graph is None:
        from autopar.frontend.trace import trace

        graph = trace(model, example_inputs, example_kwargs)
    name = model_name or graph.model_name or type(model).__name__
    common = dict(model_name=name, fingerprint=fingerprint(graph), cluster=dataclasses.asdict(cluster),
                  mesh=cluster.mesh(), cost_model=cost_model, space=space, mode=mode)
    if cost_model == "pase":
        return _plan_pase(graph, model, cluster, cutoff, search, time_limit, pase_profile, pase_rate, common,
                          baselines)
    return _plan_analytic(graph, cluster, mode, optimizer, memory_capacity, search, time_limit, common,
                          baselines, pipeline)


# -- the analytic model on the mesh space --------------------------------------------------------

def _plan_analytic(graph, cluster, mode, optimizer, memory_capacity, search, time_limit, common,
                   with_baselines, pipeline="auto") -> Plan:
    from autopar.cost_models.tables import build_tables

    model = "analytic"
    if common["cost_model"] == "profiled":  # same tables and baselines, compute measured here
        from autopar.cost_models.profiled import profiled_model

        model = profiled_model(graph, cluster, mode, optimizer=optimizer)  # its update is measured too
    tables = build_tables(graph, cluster, model, space="mesh", mode=mode, optimizer=optimizer)
    if memory_capacity is not None:
        tables.memory_capacity = float(memory_capacity)
    unsupported = {n.name: n.unsupported for n in graph.nodes if n.unsupported}
    base = _analytic_baselines(graph, tables, cluster, common, unsupported) if with_baselines else {}
    from autopar.planning.whole import kept_whole

    whole = frozenset(kept_whole(graph))
    start = time.perf_counter()
    try:
        sol = run_search(tables, search, time_limit, whole)
    except InfeasibleError as e:
        least = _least_memory(tables)
        if pipeline is not False and cluster.devices > 1:
            piped = _with_pipeline(graph, cluster, mode, optimizer, tables, None, search, time_limit, common,
                                   unsupported, base, start, whole)
            if piped is not None:
                return piped
        raise InfeasibleError(
            f"no plan of {graph.model_name or 'the model'} fits {tables.memory_capacity / 2**30:.3g} GiB per device "
            f"on {cluster.devices} devices; the least autopar can reach is {least / 2**30:.3g} GiB per device "
            f"(splitting every node as finely as it can): add devices or memory", least) from e
    seconds = time.perf_counter() - start
    info = SearchInfo.exact(sol.search, seconds, sol.gap)
    info.detail = sol.detail or info.detail
    plan = _make_plan(graph, tables, sol, info, common, unsupported, base)
    if pipeline is True or (pipeline == "auto" and cluster.nodes > 1):
        piped = _with_pipeline(graph, cluster, mode, optimizer, tables, plan, search, time_limit, common,
                               unsupported, base, start, whole)
        if piped is not None and piped.cost < plan.cost:
            return piped
        if plan.search.proven_optimal:  # what is proven is proven over single-stage plans only
            plan.search.detail = "; ".join(filter(None, (
                "among single-stage plans; pipeline options priced heuristically", sol.detail)))
    return plan


def _with_pipeline(graph, cluster, mode, optimizer, tables, single, search, time_limit, common, unsupported,
                   base, start, whole=frozenset()) -> Plan | None:
    """The best pipelined plan, or None when no stage split fits."""
    from autopar.planning.stages import best_pipeline, stage_assignment
    from autopar.planning.plan import Stage

    found = best_pipeline(graph, cluster, mode, optimizer, tables.memory_capacity,
                          lambda t: run_search(t, search, time_limit, whole))
    if found is None:
        return None
    sol, option = found
    names = [n.name for n in graph.nodes]
    syncs = sol.sync or [0.0] * len(sol.stages)
    stages = [Stage(names[a:b], sol.devices, t, y, m)
              for (a, b), t, y, m in zip(sol.stages, sol.stage_time, syncs, sol.memory)]
    return Plan(**common, assignment=stage_assignment(option, graph), cost=sol.cost, units=tables.units,
                memory_per_device=max(sol.memory), search=SearchInfo("dp + pipeline", time.perf_counter() - start, status="heuristic",
                                  detail=PIPELINE_HEURISTIC),
                stages=stages, microbatches=sol.microbatches, schedule=sol.schedule, unsupported=unsupported,
                baselines=base, graph=graph, tables=None)


def _least_memory(tables: CostTables) -> float:
    return float(sum(np.min(m) for m in tables.memory))


def _make_plan(graph, tables, sol: Solution, info: SearchInfo, common, unsupported, baselines) -> Plan:
    assignment = {name: tables.configs[i][c] for i, (name, c) in enumerate(zip(tables.nodes, sol.choice))}
    return Plan(**common, assignment=assignment, cost=float(sol.cost), units=tables.units,
                memory_per_device=float(tables.total_memory(sol.choice)), search=info,
                unsupported=unsupported, baselines=baselines, graph=graph, tables=tables)


def _evaluate(tables: CostTables, choice: list[int]) -> Solution:
    return Solution(list(choice), tables.total(choice), tables.total_memory(choice), "fixed", 0.0)


def data_parallel_choice(graph: Graph, tables: CostTables) -> list[int]:
    """Each node's config that splits only its batch dim, over as many mesh axes as divide it."""
    batch = batch_dims(graph)
    choice = []
    memo: dict[tuple, int] = {}  # nodes of one signature share their config list (build_tables)
    for i, node in enumerate(graph.nodes):
        b = batch.get(node.name)
        names = [d.name for d in node.dims]
        key = (id(tables.configs[i]), b, tuple(names))
        if key in memo:
            choice.append(memo[key])
            continue
        best, best_split = None, 0
        for j, c in enumerate(tables.configs[i]):
            used = [k for k, s in enumerate(c.splits) if s > 1]
            if not used:
                split = 1
            elif b is not None and used == [names.index(b)]:
                split = c.splits[used[0]]
            else:
                continue
            if split > best_split:
                best, best_split = j, split
        memo[key] = best if best is not None else 0
        choice.append(memo[key])
    return choice


def _analytic_baselines(graph, tables, cluster, common, unsupported) -> dict[str, Plan]:
    out = {}
    dp_choice = data_parallel_choice(graph, tables)
    out["data_parallel"] = _make_plan(graph, tables, _evaluate(tables, dp_choice), SearchInfo("fixed", 0.0, status="fixed"),
                                      common, unsupported, {})
    from autopar.planning.expert import expert_pins, is_transformer_like, matches

    if is_transformer_like(graph):
        mesh = cluster.mesh()
        pins = expert_pins(graph, batch_dims(graph), mesh.shape, mesh.level)
        keep = []
        memo: dict[tuple, list[int]] = {}  # nodes of one signature share their config list
        for i, node in enumerate(graph.nodes):
            names = tuple(d.name for d in node.dims)
            pin = pins[node.name]
            key = (id(tables.configs[i]), names, tuple(sorted(pin.dims.items())), pin.dp, pin.exact)
            if key not in memo:
                memo[key] = [j for j, c in enumerate(tables.configs[i])
                             if not c.mesh_axes or matches(pin, names, c.mesh_axes)]
            keep.append(memo[key] or [dp_choice[i]])
        sub = restrict(tables, keep)
        sub.memory_capacity = math.inf  # a baseline is priced as written, fitting or not
        from autopar.planning.whole import kept_whole

        start = time.perf_counter()
        sol = run_search(sub, "dp", math.inf, frozenset(kept_whole(graph)))
        sol.choice = [keep[i][c] for i, c in enumerate(sol.choice)]
        out["expert"] = _make_plan(graph, tables, _evaluate(tables, sol.choice),
                                   SearchInfo("dp (pinned)", time.perf_counter() - start, status="fixed",
                                              detail="the expert layout; its free nodes by the exact DP"), common, unsupported, {})
    return out


# -- PaSE's model and space -----------------------------------------------------------------------

def _plan_pase(graph, model, cluster, cutoff, search, time_limit, profile, rate, common, with_baselines) -> Plan:
    from autopar.pase import model as pase
    from autopar.pase.view import PROFILES

    if profile is None:
        guess = type(model).__name__.lower().replace("_", "")
        profile = next((k for k in PROFILES if k != "default" and guess.startswith(k[:5])), "default")
    r = pase.rate(*rate)
    pgraph, tables = pase.tables_for(graph, cluster.devices, profile, kappa=cutoff, r=r)
    start = time.perf_counter()
    sol = run_search(tables, search, time_limit)
    info = SearchInfo.exact(sol.search, time.perf_counter() - start, sol.gap)
    base = {}
    if with_baselines:
        dp_choice = pase.choice_of(tables, pase.data_parallel(pgraph, cluster.devices, cutoff))
        base["data_parallel"] = _make_plan(pgraph, tables, _evaluate(tables, dp_choice), SearchInfo("fixed", 0.0, status="fixed"),
                                           common, {}, {})
    return _make_plan(pgraph, tables, sol, info, common, {}, base)

