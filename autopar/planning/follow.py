"""A reduced space for big searches: memory-bound ops follow their producer's layout.

A transformer layer traced by torch.export carries dozens of ops without FLOPs or parameters
(``view``, ``transpose``, ``repeat_kv``'s ``unsqueeze``/``expand``, the rotary ``slice``/``cat``/``mul``,
casts), each with as many configs as its tensor has layouts (1000-2800 on 64 devices). The exact
DP eliminates them one by one, each step costing the product of three such counts: on a
24-layer Llama on 64 GPUs, 3.5e10 min-plus terms (26 s); with these ops following, 6e9 (5 s).

``follow_producers`` makes that the space: a node without FLOPs or parameters whose only producer
with a choice is u takes, for each config of u, the config that costs least given it (its own
cost plus the reshard from u: for a view, the matching layout). The node then has no choice of
its own: its cost, memory and edges move onto the root of its chain of producers, gathered
through that map, so the tables are smaller and equal to the original ones restricted to that
space. Plans from them are optimal over the reduced space, not the full one (a resharding view
can be cheaper: on that Llama the full optimum is 1.1% faster), and the planner says so
(``DETAIL``, in ``plan.search``); it reduces only when asked or when the full space is too big
for the DP (``wanted``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.core.ir import Graph
from autopar.core.tables import CostTables

DETAIL = ("optimal over a space where ops without FLOPs or parameters (views, casts, elementwise) "
          "follow their producer's layout")
# the exact DP's work (min-plus terms) above which the planner searches the reduced space
FOLLOW_ABOVE_TERMS = 1e10


@dataclass
class Followed:
    """Reduced tables and how to map their solution back: ``root[i]`` is the node whose config
    decides node i's, ``pick[i]`` (None for roots) node i's config per config of its root."""

    tables: CostTables
    root: list[int]
    pick: list[np.ndarray | None]

    def choice(self, reduced: list[int]) -> list[int]:
        return [int(reduced[i]) if p is None else int(p[reduced[r]]) for i, (r, p) in
                enumerate(zip(self.root, self.pick))]


def _follows(graph: Graph, tables: CostTables) -> dict[int, int]:
    """node -> its producer, for nodes that follow their producer."""
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    out = {}
    for v, node in enumerate(graph.nodes):
        if node.flops or node.params or node.unsupported or len(tables.configs[v]) < 2:
            continue
        producers = {index[o.source] for o in node.inputs if o.is_node}
        free = [u for u in producers if len(tables.configs[u]) > 1]
        if len(free) == 1 and (free[0], v) in tables.edge_cost:
            out[v] = free[0]
    return out


def wanted(follow, graph: Graph | None, tables: CostTables, search: str) -> bool:
    """``follow``: True, False or "auto" (when the exact DP over the full space would compute more
    than ``FOLLOW_ABOVE_TERMS`` min-plus terms, or needs more memory than it may have)."""
    if follow not in (True, False, "auto"):
        raise ValueError(f"follow must be True, False or 'auto', not {follow!r}")
    if follow is False or graph is None or [n.name for n in graph.nodes] != list(tables.nodes):
        return False
    if follow is True:
        return True
    if search not in ("auto", "dp"):
        return False
    from autopar.search.common import SearchTooLargeError
    from autopar.search.dp import dp_plan

    try:
        return dp_plan(tables).work > FOLLOW_ABOVE_TERMS
    except SearchTooLargeError:
        return True


def follow_producers(graph: Graph, tables: CostTables) -> Followed | None:
    """The reduced tables of the module docstring, or None when no node follows."""
    follows = _follows(graph, tables)
    if not follows:
        return None
    n = len(tables.nodes)
    root = list(range(n))
    pick: list[np.ndarray | None] = [None] * n
    memo: dict[tuple, np.ndarray] = {}
    for v in sorted(follows):
        u = follows[v]
        e = np.asarray(tables.edge_cost[(u, v)])
        own = np.asarray(tables.node_cost[v])
        key = ("g", id(e), own.tobytes())
        if key not in memo:  # layers share their edge arrays: one map per distinct pair
            memo[key] = np.argmin(e + own[None, :], axis=1)
        g = memo[key]
        root[v] = root[u]
        if pick[u] is None:
            pick[v] = g
        else:
            key = ("c", id(g), id(pick[u]))
            if key not in memo:
                memo[key] = g[pick[u]]
            pick[v] = memo[key]

    def gather(vec, i):
        return np.asarray(vec) if pick[i] is None else np.asarray(vec)[pick[i]]

    configs, node_cost, memory = list(tables.configs), list(tables.node_cost), list(tables.memory)
    for v in follows:
        r = root[v]
        node_cost[r] = node_cost[r] + gather(tables.node_cost[v], v)
        node_cost[v] = np.zeros(1)
        configs[v] = tables.configs[v][:1]  # a placeholder: ``Followed.choice`` gives the real one
        if memory:
            memory[r] = memory[r] + gather(tables.memory[v], v)
            memory[v] = np.zeros(1)
    edges: dict[tuple[int, int], np.ndarray] = {}
    for (i, j), m in tables.edge_cost.items():
        ri, rj = root[i], root[j]
        if ri == rj:  # both decided by one root: a cost of that root alone
            m = np.asarray(m)
            rows = pick[i] if pick[i] is not None else np.arange(m.shape[0])
            cols = pick[j] if pick[j] is not None else np.arange(m.shape[1])
            node_cost[ri] = node_cost[ri] + m[rows, cols]
            continue
        if pick[i] is None and pick[j] is None:
            g = m  # the same object: the DP recognizes repeated layers by identity first
        else:
            key = ("e", id(m), id(pick[i]), id(pick[j]))
            if key not in memo:
                a = np.asarray(m)
                if pick[i] is not None:
                    a = a[pick[i], :]
                if pick[j] is not None:
                    a = a[:, pick[j]]
                memo[key] = a
            g = memo[key]
        if ri > rj:
            ri, rj, g = rj, ri, np.asarray(g).T
        edges[(ri, rj)] = edges[(ri, rj)] + g if (ri, rj) in edges else g
    reduced = CostTables(list(tables.nodes), configs, node_cost, edges, memory, tables.memory_capacity,
                         tables.units)
    return Followed(reduced, root, pick)
