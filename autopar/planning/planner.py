"""``autopar.plan``: trace -> cost tables -> search -> Plan, with the baselines priced alike.

This is the only place that knows both a cost model and a search (``registry.py``): it hands the
tables from one to the other, then records what the report needs (``breakdown.py``) with the
same tables and model, so the plan can be reported anywhere without re-pricing.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from autopar.core.margin import capacity_words
from autopar.core.cluster import Cluster
from autopar.core.errors import InfeasibleError
from autopar.search.common import SearchTooLargeError
from autopar.core.fingerprint import fingerprint
from autopar.core.ir import Graph
from autopar.core.resolve import resolve_cluster  # noqa: F401  (also imported from here)
from autopar.core.tables import CostTables, Solution
from autopar.core.strategy import Strategy, TrainingOptions
from autopar.planning import baselines as base_plans
from autopar.planning import breakdown, fallback, registry
from autopar.planning.notices import mesh_axis_notices
from autopar.planning.plan import Plan, SearchInfo, Stage
from autopar.planning.settings import SearchSettings, SpaceSettings, TrainingSettings

# What a pipelined plan is (planning/stages.py): not an optimum over stages x splits.
PIPELINE_HEURISTIC = ("stage cuts exact for the given per-stage plans; each stage's splits are the "
                      "whole graph's optimum at the microbatch size, not re-optimized per stage")


def parse_space(space: str) -> tuple[str, int]:
    """'mesh' -> ('mesh', 0); 'pase' -> ('pase', 4); 'pase:N' -> ('pase', N)."""
    if space == "mesh":
        return "mesh", 0
    if space == "pase":
        return "pase", 4
    if space.startswith("pase:") and space[5:].isdigit() and int(space[5:]) >= 1:
        return "pase", int(space[5:])
    raise ValueError(f"unknown space {space!r}; use 'mesh', 'pase' (cutoff 4) or 'pase:N'")


def run_search(tables: CostTables, search: str, time_limit: float, whole: frozenset[str] = frozenset(),
               graph: Graph | None = None, follow: bool | str = False) -> Solution:
    """The search on ``tables`` with the nodes named in ``whole`` fixed to their replicated config.

    ``whole``: cheap values many layers read (``autopar.planning.whole.kept_whole``: masks, position
    tables); fixed, they no longer tie the layers together in the exact search, and every node left
    with one config is folded into its neighbours' costs (exact). The solution says in ``detail``
    that it is optimal among plans that keep them whole. ``follow`` (with ``graph``, whose nodes
    are the tables'): search the space where view-like ops follow their producers
    (``planning/follow.py``): True, False, or "auto" (when the full space is too big for the DP);
    ``detail`` says so. Without either the tables are searched as they are."""
    from autopar.planning import follow as fol
    from autopar.planning.whole import fix_and_fold, replicated_index

    fixed = {i: replicated_index(tables, i) for i, name in enumerate(tables.nodes)
             if name in whole and len(tables.configs[i]) > 1}
    run = registry.search(search).run
    folded = fix_and_fold(tables, fixed) if fixed else tables
    reduced = fol.follow_producers(graph, folded) if fol.wanted(follow, graph, folded, search) else None
    if reduced is None and not fixed:  # the tables as they are (the same optimum, the same ties)
        return run(tables, time_limit)
    sol = run(reduced.tables if reduced is not None else folded, time_limit)
    if reduced is not None:
        sol.choice = reduced.choice(sol.choice)
    sol.choice = [fixed.get(i, c) for i, c in enumerate(sol.choice)]
    details = []
    if fixed:
        details.append(f"among plans that keep {len(fixed)} values read by many layers (masks, position "
                       f"tables) whole")
    if reduced is not None:
        details.append(fol.DETAIL)
    sol.detail = "; ".join(details)
    return sol


def plan(model, example_inputs=(), cluster=None, *, example_kwargs=None, devices: int | None = None,
         cost_model="analytic",
         space: str = "mesh", search: str = "auto", mode: str = "train", optimizer: str | None = "adam",
         memory_capacity: float | None = None, time_limit: float = 60.0, graph: Graph | None = None,
         model_name: str = "", pase_profile: str | None = None, pase_rate: tuple[float, float] = (10.0, 16.0),
         baselines: bool = True, pipeline: bool | str = "auto", explain: bool = False,
         precision: str | None = None, zero="auto", recompute="auto", pin=None,
         hierarchical: bool | str = "auto", follow: bool | str = "auto", accumulate="auto") -> Plan:
    """Find the best strategy for ``model`` on ``cluster`` under ``cost_model``.

    ``example_inputs``/``example_kwargs``: the call, as ``autopar.trace`` takes it (positional inputs,
    keyword inputs, or one dict of keyword inputs). ``cluster``: None (the default, the local machine: the ``cpu`` preset,
    ``devices`` of them, by default the process group's size or the local machine's cores), a preset
    name (``"8xA100"``), a device count (the default cluster with that many devices) or an
    ``autopar.Cluster`` (``autopar.core.resolve``). ``memory_capacity`` (bytes per device) overrides the cluster's:
    it is the device's memory, and like the cluster's it is planned against less the safety margin
    of ``autopar.core.margin`` (10% + 512 MiB) that ``autopar.compile`` enforces, so a plan called
    fitting is one compile accepts (``margin.device_memory_for(b)`` is the capacity that lets a plan use ``b``).
    ``cost_model``, ``search``, ``space``: see ``autopar.planning.registry`` (``cost_model`` may also
    be a mesh cost model object, e.g. a ``ProfiledModel`` with its own options). PaSE's model
    (``pase_rate`` = its TFLOP/s and GB/s) prices PaSE's view of the graph in its own space;
    ``pase_profile`` names its per-model fold rules (default: from the model class's name).
    ``pipeline``: True searches pipeline stages too, False never; "auto" when the cluster has
    several nodes or no single-stage plan fits; a pipeline is taken only when predicted faster or
    the only plan that fits. ``explain``: keep every term's arithmetic in the plan.
    ``precision`` ("fp32", "bf16", "fp16"; None: for training, the devices' fastest mixed precision
    where it beats fp32, on both paths: ``core.strategy.default_precision``; fp32 on the ``cpu``
    preset), ``zero`` (0-3 or "auto"), ``recompute`` (bool, k: every k-th block, or
    "auto"): the training options (``autopar.core.strategy``). ``hierarchical``: plan by degrees
    per cluster level (``planning/hierarchical.py``); "auto" when the cluster has more than 64
    devices or several pods, or a ``pin`` ("tensor=8,pipeline=64,data=6") is given, which adds
    the pinned plan as the "published" baseline; under "auto" it also runs where memory binds the
    flat search, whose plan it replaces when faster or when the flat space holds none that fits
    (``planning/fallback.py``; False: the flat search alone, InfeasibleError where nothing fits).
    ``follow``: search a space where view-like ops follow their producer's layout
    (``planning/follow.py``): True, False, or "auto" (only when the exact DP over the full space
    would be too slow); the plan's search line says which space.
    ``accumulate``: gradient accumulation on the flat path, k microbatches a step with one
    gradient sync ("auto": 2 and 4 searched where memory binds; an int k: k, 1 for none).
    """
    return plan_with(model, example_inputs, cluster, example_kwargs=example_kwargs, devices=devices,
                     cost_model=cost_model, memory_capacity=memory_capacity, graph=graph,
                     model_name=model_name,
                     searching=SearchSettings(search, time_limit, pipeline, hierarchical, follow, baselines,
                                              explain),
                     training=TrainingSettings(mode, optimizer, precision, zero, recompute, accumulate),
                     scope=SpaceSettings(space, pin, pase_profile, pase_rate))


def plan_with(model, example_inputs, cluster, *, example_kwargs, devices, cost_model, memory_capacity,
              graph, model_name, searching: SearchSettings, training: TrainingSettings,
              scope: SpaceSettings) -> Plan:
    """``plan`` with its options grouped (``planning/settings.py``), each group checked as made."""
    registry.search(searching.search)
    entry = registry.cost_model(cost_model)
    if memory_capacity is not None and not (memory_capacity > 0):  # also refuses NaN
        raise ValueError(f"memory_capacity is bytes per device and must be > 0, not {memory_capacity!r}")
    space_kind, cutoff = parse_space(scope.space)
    if entry.space != space_kind:
        also = " or 'pase:N'" if entry.space == "pase" else ""
        raise ValueError(
            f"cost_model={entry.name!r} goes with space={entry.space!r}{also}, not {scope.space!r}")
    cluster = resolve_cluster(cluster, devices)
    if graph is None:  # a deep model's repeated layers traced once (frontend/depth.py)
        from autopar.frontend.depth import trace_for_planning

        graph = trace_for_planning(model, example_inputs, example_kwargs)
    name = model_name or graph.model_name or type(model).__name__
    common = dict(model_name=name, fingerprint=fingerprint(graph), cluster=dataclasses.asdict(cluster),
                  mesh=cluster.mesh(), cost_model=entry.name, space=scope.space, mode=training.mode)
    if memory_capacity is not None:  # the plan (and its report and file) says the capacity it was made for
        common["cluster"]["memory_capacity"] = float(memory_capacity)
    from autopar.planning import hierarchical as hier

    if hier.wanted(searching.hierarchical, cluster, scope.pin, entry.name):
        return _plan_hierarchical(graph, cluster, common, training, scope, searching, memory_capacity)
    if entry.space == "pase":
        return _plan_pase(graph, model, cluster, cutoff, searching, scope, common)
    # one path for every size: where the flat exact search would exceed its budget (planning/budget.py),
    # or refuses its tables, the hierarchical search plans, and the search line says why
    from autopar.planning import budget

    may_fall_back = _hierarchical_can_take(graph, entry, searching)
    if may_fall_back:
        from autopar.planning.options import option_sets

        sets = option_sets(*training.choices, cluster=cluster, mode=training.mode, accumulate=training.accumulate)
        why = budget.over_budget(graph, cluster, sets=len(sets))
        if why:
            return _plan_hierarchical(graph, cluster, common, training, scope, searching, memory_capacity, why)
    try:
        flat, binds = _plan_mesh(entry, graph, cluster, memory_capacity, common, searching, training)
    except SearchTooLargeError as e:
        if not may_fall_back:
            raise
        return _plan_hierarchical(graph, cluster, common, training, scope, searching, memory_capacity,
                                  budget.too_large(e))
    except InfeasibleError as e:  # the hierarchical space's many microbatches and pipelines may fit
        if not (may_fall_back and training.mode == "train"):
            raise
        try:
            hier = _plan_hierarchical(graph, cluster, common, training, scope, searching, memory_capacity)
        except (InfeasibleError, ValueError):  # neither space fits (or takes the options asked for): the
            raise e from None  # flat search's error, which names the least it reaches
        return fallback.instead_of_infeasible(e, hier)
    if not (binds and may_fall_back and training.mode == "train"):
        return flat
    # memory binds the flat search: the fastest fitting plan may lie outside its space (planning/fallback.py)
    try:
        hier, why_not = _plan_hierarchical(graph, cluster, common, training, scope, searching, memory_capacity), ""
    except (InfeasibleError, ValueError) as e:  # none fits, or the options asked for are not in its space
        hier, why_not = None, str(e).split(";")[0]
    return fallback.faster(flat, hier, why_not)


def _hierarchical_can_take(graph: Graph, entry, searching: SearchSettings) -> bool:
    """Whether the hierarchical search may stand in for the flat one: asked for neither way, the
    analytic model, the exact DP (a search named by the caller runs as asked), a batched input."""
    if searching.hierarchical != "auto" or entry.name != "analytic" or searching.search not in ("auto", "dp"):
        return False
    return any(spec.shape for spec in graph.inputs.values())


def _plan_hierarchical(graph, cluster, common, training: TrainingSettings, scope: SpaceSettings,
                       searching: SearchSettings, memory_capacity, detail: str = "") -> Plan:
    """The hierarchical search; its tensor groups' layouts by the exact DP in the same space as the
    flat search's (masks and position tables kept whole, views following their producers when the
    full space is too big: ``run_search``). ``detail``: why this path ran, for the search line."""
    from autopar.planning import hierarchical as hier
    from autopar.planning.whole import kept_whole

    from autopar.planning.follow import DETAIL

    search = "dp" if searching.search == "auto" else searching.search
    whole = frozenset(kept_whole(graph))
    decided: dict[tuple, bool] = {}  # configs per node -> whether "auto" reduced the space (same sizes, same answer)

    def solve(tables, g=None):
        key = tuple(len(c) for c in tables.configs)
        sol = run_search(tables, search, searching.time_limit, whole, g, decided.get(key, searching.follow))
        decided[key] = DETAIL in (getattr(sol, "detail", "") or "")
        return sol

    plan = hier.plan_hierarchical(
        graph, cluster, common, training, pin=scope.pin, memory_capacity=memory_capacity,
        time_limit=searching.time_limit, solve=solve, with_baselines=searching.baselines)
    plan.search.path = detail
    return plan


# -- mesh cost models (analytic, profiled) --------------------------------------------------------

def _plan_mesh(entry, graph, cluster, memory_capacity, common, searching: SearchSettings,
               training: TrainingSettings) -> tuple[Plan, bool]:
    """The flat exact search's plan, and whether memory binds it (the plain option set's fastest
    plan does not fit: ``FlatOptions.binds``); InfeasibleError when no plan of its space fits."""
    from autopar.planning.options import FlatOptions, option_sets, strategy_of

    mode, optimizer, pipeline = training.mode, training.optimizer, searching.pipeline
    model = entry.make(graph, cluster, mode, optimizer)
    # training options (planning/options.py): the plain set's tables; ZeRO / recompute when memory binds
    flat = FlatOptions(graph, cluster, model, mode, optimizer, memory_capacity,
                       option_sets(*training.choices, cluster=cluster, mode=mode, accumulate=training.accumulate))
    priced, tables = flat.tables_for(flat.sets[0])
    unsupported = {n.name: n.unsupported for n in graph.nodes if n.unsupported}
    base = _mesh_baselines(priced, tables, cluster, common, unsupported, flat) if searching.baselines else {}
    from autopar.planning.whole import kept_whole

    whole = frozenset(kept_whole(graph))
    # pipelines are priced in the plain option set's precision, as the single-stage plans are
    ctx = dict(graph=flat.graph_for(flat.sets[0]), precision=flat.sets[0].precision, cluster=cluster,
               training=training, model=model, searching=searching,
               common=common, unsupported=unsupported, base=base, units=tables.units, whole=whole)
    start = time.perf_counter()
    try:
        opts, priced, tables, sol = flat.solve(
            lambda t, limit: run_search(t, searching.search, limit, whole, graph, searching.follow),
            searching.time_limit)
    except InfeasibleError as e:
        least = float(sum(np.min(m) for m in tables.memory))
        if pipeline is not False and cluster.devices > 1:
            piped = _with_pipeline(ctx, tables.memory_capacity, start)
            if piped is not None:
                return piped, True
        usable, device = max(tables.memory_capacity, 0.0), memory_capacity or cluster.memory_capacity
        raise InfeasibleError(
            f"no plan of {graph.model_name or 'the model'} fits {usable / 2**30:.3g} GiB per device "
            f"({capacity_words(device)}) on {cluster.devices} devices; the least autopar can reach is "
            f"{least / 2**30:.3g} GiB per device (splitting every node as finely as it can): add devices or memory",
            least) from e
    from autopar.planning.ties import prefer_data_parallel

    near = prefer_data_parallel(tables, sol, base_plans.data_parallel_choice(graph, tables))
    if near is not sol and flat.peak(opts, near.choice) <= max(flat.peak(opts, sol.choice), tables.memory_capacity):
        sol = near  # (the move holds no more backward memory; its update's peak must fit too)
    info = SearchInfo.exact(sol.search, time.perf_counter() - start, sol.gap)
    info.detail = getattr(sol, "detail", "") or info.detail
    if searching.follow == "auto":  # the stages are searched in the space the single-stage plan was
        from autopar.planning.follow import DETAIL

        ctx["searching"] = dataclasses.replace(searching, follow=DETAIL in info.detail)
    plan = _make_plan(graph, tables, sol, info, common, unsupported, base, priced, cluster.mesh())
    # the backward's (with ZeRO-3's gathered parameters) or the optimizer update's
    plan.memory_per_device = max(plan.memory_per_device, flat.peak(opts, sol.choice))
    plan.strategy = strategy_of(graph, opts, plan.assignment)
    plan.rows = breakdown.mesh_rows(priced, tables, plan.assignment, model, cluster, mode)
    plan.notices = mesh_axis_notices(priced, tables, plan.assignment, cluster.mesh())
    if searching.explain and entry.name == "analytic":
        from autopar.cost_models.explain import explain_plan

        plan.explanation = explain_plan(priced, plan.assignment, cluster, model=model, mode=mode)
    if pipeline is True or (pipeline == "auto" and cluster.nodes > 1):
        # options that cannot beat the single-stage plan are never solved (stages.best_pipeline)
        piped = _with_pipeline(ctx, tables.memory_capacity, start, bound=plan.cost)
        if piped is not None and piped.cost < plan.cost:
            return piped, flat.binds
        if plan.search.proven_optimal:  # what is proven is proven over single-stage plans only
            plan.search.detail = "; ".join(filter(None, [
                "among single-stage plans; pipeline options priced heuristically", plan.search.detail]))
    return plan, flat.binds


def _with_pipeline(ctx: dict, capacity: float, start: float, bound: float = math.inf) -> Plan | None:
    """The best pipelined plan, or None when no stage split fits or none is cheaper than ``bound``."""
    from autopar.planning.stages import batch_size_of, best_pipeline, stage_assignment

    graph, cluster, model = ctx["graph"], ctx["cluster"], ctx["model"]
    training, settings = ctx["training"], ctx["searching"]
    found = best_pipeline(graph, cluster, training.mode, training.optimizer, capacity,
                          lambda t: run_search(t, settings.search, settings.time_limit, ctx["whole"], graph,
                                               settings.follow), model,
                          bound=bound)
    if found is None:
        return None
    sol, option = found
    names = [n.name for n in graph.nodes]
    syncs = sol.sync or [0.0] * len(sol.stages)
    stages = [Stage(names[a:b], sol.devices, t, y, m)
              for (a, b), t, y, m in zip(sol.stages, sol.stage_time, syncs, sol.memory)]
    sub = cluster.with_devices(sol.devices)
    precision = ctx.get("precision", "fp32")
    strategy = Strategy(options=TrainingOptions(precision=precision)) if precision != "fp32" else None
    rows = breakdown.stage_rows(option, sol, model, sub, training.mode)
    for stage, row in zip(stages, rows):  # per step: the microbatches' compute and the optimizer update once
        stage.compute = sol.microbatches * row.compute + sum(t.seconds for r in row.nodes for t in r.terms
                                                             if t.kind == "optimizer")
    return Plan(**ctx["common"], assignment=stage_assignment(option, graph), cost=sol.cost, units=ctx["units"],
                strategy=strategy,
                memory_per_device=max(sol.memory),
                search=SearchInfo("dp + pipeline", time.perf_counter() - start, status="heuristic",
                                  detail=_pipeline_detail(settings.follow)),
                stages=stages, microbatches=sol.microbatches, schedule=sol.schedule,
                unsupported=ctx["unsupported"], baselines=ctx["base"],
                stage_rows=rows,
                stage_mesh=tuple(sub.mesh().shape), batch=batch_size_of(graph), graph=graph, tables=None)


def _pipeline_detail(follow) -> str:
    """What a pipelined plan is, with the space its stages were searched in."""
    if follow is False:
        return PIPELINE_HEURISTIC
    from autopar.planning.follow import DETAIL

    space = DETAIL.removeprefix("optimal over ")
    when = "" if follow is True else " where a stage's full space was too big for the DP"
    return f"{PIPELINE_HEURISTIC}; stages searched over {space}{when}"


def _make_plan(graph, tables, sol: Solution, info: SearchInfo, common, unsupported, baselines,
               trained=None, mesh=None) -> Plan:
    """``trained`` (the graph the tables price) and ``mesh``: ZeRO-3's gathered parameters added
    to the memory (``cost_models/zero3.py``)."""
    assignment = {name: tables.configs[i][c] for i, (name, c) in enumerate(zip(tables.nodes, sol.choice))}
    extra = 0.0
    if trained is not None and mesh is not None:
        from autopar.cost_models.zero3 import gathered

        extra = gathered(trained, tables, sol.choice, mesh)
    return Plan(**common, assignment=assignment, cost=float(sol.cost), units=tables.units,
                memory_per_device=float(tables.total_memory(sol.choice)) + extra, search=info,
                unsupported=unsupported, baselines=baselines, graph=graph, tables=tables)


def _mesh_baselines(graph, tables, cluster, common, unsupported, flat=None) -> dict[str, Plan]:
    from autopar.planning.expert import is_transformer_like

    dp_choice = base_plans.data_parallel_choice(graph, tables)
    out = {"data_parallel": _make_plan(graph, tables, base_plans.evaluate(tables, dp_choice),
                                       base_plans.FIXED, common, unsupported, {})}
    if flat is not None:  # data parallelism with the ZeRO stage / recomputation that makes it fit
        from autopar.planning.options import strategy_of

        opts, g, t, choice = flat.fitting_data_parallel(base_plans.data_parallel_choice)
        out["data_parallel"] = _make_plan(g, t, base_plans.evaluate(t, choice), base_plans.FIXED, common,
                                          unsupported, {}, g, flat.cluster.mesh())
        out["data_parallel"].strategy = strategy_of(g, opts, out["data_parallel"].assignment)
        out["data_parallel"].memory_per_device = max(out["data_parallel"].memory_per_device, flat.peak(opts, choice))
    if is_transformer_like(graph):
        from autopar.planning.whole import kept_whole

        choice, seconds = base_plans.expert_choice(
            graph, tables, cluster.mesh(), dp_choice,
            lambda sub: run_search(sub, "dp", float("inf"), frozenset(kept_whole(graph))))
        out["expert"] = _make_plan(graph, tables, base_plans.evaluate(tables, choice),
                                   base_plans.expert_info(seconds), common, unsupported, {})
    return out


# -- PaSE's model and space -----------------------------------------------------------------------

def _plan_pase(graph, model, cluster, cutoff, searching: SearchSettings, scope: SpaceSettings, common) -> Plan:
    from autopar.pase import model as pase
    from autopar.pase.view import PROFILES

    profile, rate = scope.pase_profile, scope.pase_rate
    if profile is None:
        guess = type(model).__name__.lower().replace("_", "")
        profile = next((k for k in PROFILES if k != "default" and guess.startswith(k[:5])), "default")
    pgraph, tables = pase.tables_for(graph, cluster.devices, profile, kappa=cutoff, r=pase.rate(*rate))
    start = time.perf_counter()
    sol = run_search(tables, searching.search, searching.time_limit)
    info = SearchInfo.exact(sol.search, time.perf_counter() - start, sol.gap)
    base = {}
    if searching.baselines:
        dp_choice = pase.choice_of(tables, pase.data_parallel(pgraph, cluster.devices, cutoff))
        base["data_parallel"] = _make_plan(pgraph, tables, base_plans.evaluate(tables, dp_choice),
                                           base_plans.FIXED, common, {}, {})
    plan = _make_plan(pgraph, tables, sol, info, common, {}, base)
    plan.rows = breakdown.pase_rows(pgraph, tables, plan.assignment)
    plan.pase_rate = breakdown.pase_rate(pgraph, tables)
    return plan
