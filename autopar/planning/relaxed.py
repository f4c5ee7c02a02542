"""A relaxation of a tensor group's cost tables small enough for the exact DP, for lower bounds.

The planner keeps cheap values many layers read (masks, rotary tables: ``whole.kept_whole``)
replicated while it searches (``planner.run_search``); the space the bound is over lets them take
any config, and so joins all the layers that read them in one DP table (18 GiB for a 405B window
on a tensor group of 16). A lower bound needs no exact solve of that space, only of one below it:
``detach`` replaces every edge of such a node ``u`` by its least over ``u``'s configs, a cost of
the other end alone, ``e'(j) = min_i e(i, j) <= e(i, j)`` for every ``i``. Every layout then costs
at least as much in the original tables as in the detached ones, node for node and edge for edge,
so the detached optimum (or a Lagrangian bound of it) is a lower bound of the original's; ``u``
keeps its own cost and memory and is solved on its own. Where the replicated config is the least
for every reader (a replicated value is read by any split for free), the detached tables cost what
the planner's whole-kept ones do."""

from __future__ import annotations

import numpy as np

from autopar.core.ir import Graph
from autopar.core.tables import CostTables
from autopar.planning.whole import kept_whole


def detach(tables: CostTables, names: set[str]) -> CostTables:
    """``tables`` with the edges of the nodes named in ``names`` replaced by their least over those
    nodes' configs (a cost of the other end; an edge between two such nodes, its least entry)."""
    cut = {i for i, name in enumerate(tables.nodes) if name in names}
    node_cost = list(tables.node_cost)
    edges = {}
    for (u, v), m in tables.edge_cost.items():
        if u in cut and v in cut:
            node_cost[u] = node_cost[u] + float(np.min(m))
        elif u in cut:
            node_cost[v] = node_cost[v] + np.min(np.asarray(m), axis=0)
        elif v in cut:
            node_cost[u] = node_cost[u] + np.min(np.asarray(m), axis=1)
        else:
            edges[(u, v)] = m
    return CostTables(list(tables.nodes), list(tables.configs), node_cost, edges, list(tables.memory),
                      tables.memory_capacity, tables.units)


def detached(tables: CostTables, graph: Graph) -> CostTables | None:
    """``detach`` on the values ``graph`` (the tables' graph) keeps whole; None when it has none."""
    names = kept_whole(graph) & set(tables.nodes)
    return detach(tables, names) if names else None
