"""The plans autopar is compared with, priced on the same tables as its own plan.

Data parallelism (each node split only along its batch dim, over as many mesh axes as divide
it) and, for transformer-like graphs, the Megatron-style expert layout (``expert.py``; its free
nodes solved by the exact DP). Both are restrictions of the search's tables
(``core.tables.restrict``), so every number is directly comparable with the plan's own.
"""

from __future__ import annotations

import math
import time

from autopar.core.batch import batch_dims
from autopar.core.ir import Graph
from autopar.core.tables import CostTables, Solution, restrict
from autopar.planning.plan import SearchInfo


def evaluate(tables: CostTables, choice: list[int]) -> Solution:
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


def expert_choice(graph: Graph, tables: CostTables, mesh, dp_choice: list[int], solve=None) -> tuple[list[int], float]:
    """The Megatron-style layout: pinned nodes as the expert pins them, the rest by the exact DP
    over the restricted tables (``solve``: the planner's search, default the plain DP). Returns
    (choice, seconds the search took)."""
    from autopar.planning.expert import expert_pins, matches
    from autopar.search.dp import dp

    solve = solve or dp
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
    start = time.perf_counter()
    sol = solve(sub)
    return [keep[i][c] for i, c in enumerate(sol.choice)], time.perf_counter() - start


FIXED = SearchInfo("fixed", 0.0, status="fixed")


def expert_info(seconds: float) -> SearchInfo:
    return SearchInfo("dp (pinned)", seconds, status="fixed",
                      detail="the expert layout; its free nodes by the exact DP")
