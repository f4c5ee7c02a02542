"""Cost models and searches, each defined once: ``autopar.plan``, the CLI's choices and its
``--help`` all read these tables, so adding one is one entry here.

A mesh cost model (an ``autopar.core.cost_model.CostModel``) prices the traced graph on the device
mesh (``make`` builds it for a graph and cluster); PaSE's model (the same contract) prices PaSE's
own view of the graph in its own space, so it plans through its own function. A search maps cost
tables to a ``Solution``; which cost model filled the tables it never knows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from autopar.core.cost_model import CostModel
from autopar.core.tables import CostTables, Solution


@dataclass(frozen=True)
class CostModelEntry:
    name: str
    help: str
    space: str  # the space kind it prices: "mesh" or "pase"
    make: Callable | None = None  # (graph, cluster, mode, optimizer) -> model, for mesh models


def _analytic(graph, cluster, mode, optimizer):
    from autopar.cost_models.analytic import AnalyticModel

    return AnalyticModel(optimizer=optimizer if mode == "train" else None)


def _profiled(graph, cluster, mode, optimizer):
    from autopar.cost_models.profiled import profiled_model

    return profiled_model(graph, cluster, mode, optimizer=optimizer)  # its update is measured too


COST_MODELS: dict[str, CostModelEntry] = {e.name: e for e in (
    CostModelEntry("analytic", "roofline compute + alpha-beta collectives, in seconds", "mesh", _analytic),
    CostModelEntry("profiled", "compute measured on the local machine (cached), collectives as analytic",
                   "mesh", _profiled),
    CostModelEntry("pase", "PaSE's cost model on PaSE's view of the graph (FLOP-equivalent units); "
                   "needs --space pase or pase:N", "pase"),
)}


@dataclass(frozen=True)
class SearchEntry:
    name: str
    help: str
    run: Callable[[CostTables, float], Solution]  # (tables, time limit in s) -> solution


def _auto(tables: CostTables, time_limit: float) -> Solution:
    from autopar.search.common import SearchTooLargeError
    from autopar.search.dp import dp
    from autopar.search.ilp import ilp

    try:
        return dp(tables, ilp_time_limit=time_limit)
    except SearchTooLargeError:
        return ilp(tables, time_limit=time_limit)


def _dp(tables: CostTables, time_limit: float) -> Solution:
    from autopar.search.dp import dp

    return dp(tables, ilp_time_limit=time_limit)


def _ilp(tables: CostTables, time_limit: float) -> Solution:
    from autopar.search.ilp import ilp

    return ilp(tables, time_limit=time_limit)


def _brute(tables: CostTables, time_limit: float) -> Solution:
    from autopar.search.brute import brute

    return brute(tables)


SEARCHES: dict[str, SearchEntry] = {e.name: e for e in (
    SearchEntry("auto", "the exact DP, the ILP where the DP's tables would not fit in memory", _auto),
    SearchEntry("dp", "PaSE's exact dynamic program (the ILP closes a memory-limit duality gap)", _dp),
    SearchEntry("ilp", "an integer program solved by HiGHS through OR-tools", _ilp),
    SearchEntry("brute", "every assignment (small graphs only; the tests' reference)", _brute),
)}

SPACES = {"mesh": "splits realizable on the device mesh (default)",
          "pase": "PaSE's space with its cutoff 4", "pase:N": "PaSE's space with cutoff N"}


def cost_model(name) -> CostModelEntry:
    """The entry of a cost model by name, or one for a mesh cost model object already made: any
    ``autopar.core.cost_model.CostModel`` (an ``AnalyticModel`` or ``ProfiledModel`` configured by
    the caller: ``autopar.compile`` fits a profiled model's links on every rank of the group, then
    plans with it on rank 0; or a model of the caller's own)."""
    if not isinstance(name, str):
        if not isinstance(name, CostModel):  # a ValueError, as for every bad argument of plan()
            raise ValueError(  # noqa: TRY004
                f"cost_model must be a name ({', '.join(COST_MODELS)}) or a cost model object with "
                f"name, units, node_cost, edge_cost, output_cost and node_breakdown "
                f"(autopar.core.cost_model.CostModel), not {type(name).__name__}")
        return CostModelEntry(name.name, "given", "mesh", lambda graph, cluster, mode, optimizer: _given(
            name, graph, cluster, mode))
    if name not in COST_MODELS:
        raise ValueError(f"unknown cost model {name!r}; use one of {', '.join(COST_MODELS)}")
    return COST_MODELS[name]


def _given(model, graph, cluster, mode):
    """A given model, its measurements done for this graph (``profile``, where it has one)."""
    if hasattr(model, "profile"):
        model.profile(graph, cluster, mode)
    return model


def search(name: str) -> SearchEntry:
    if name not in SEARCHES:
        raise ValueError(f"unknown search {name!r}; use one of {', '.join(SEARCHES)}")
    return SEARCHES[name]


def choices_help(table: dict) -> str:
    """'a (what a is), b (what b is)': the CLI's help text for a registry."""
    return "; ".join(f"{k}: {v if isinstance(v, str) else v.help}" for k, v in table.items())
