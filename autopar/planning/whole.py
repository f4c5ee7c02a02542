"""Cheap values many layers read, kept whole, so the exact search stays within memory.

Models people train compute a few small tensors once and read them in every layer: the attention
mask (one ``[B, 1, S, S]`` bool read by every attention), the rotary ``cos``/``sin`` tables (read by
the query and the key path of every layer), position ids. To the exact DP each such value is a
variable that stays open across all the layers it joins: its configs multiply every message on
the way (a 24-layer Llama on 64 GPUs needed over a million GiB of tables). A value made whole on
every device (replicated) is read by any split for free (each device takes its piece), so fixing
these nodes to their replicated config loses at most their own, memory-bound compute, and the
search becomes a plain chain again.

``kept_whole`` names them: nodes without FLOPs or parameters that read no graph input (tables made
from sizes and buffers), or whose output is read in three or more repeated blocks. The planner
fixes them (``planner.run_search``) and says so in the plan: it is optimal among plans that keep
them whole. Models without such values (the zoo's) plan as before.

``fix_and_fold`` is the exact transformation the search then runs on: a node with a single config
is a constant, so each edge it has is a cost vector of its neighbour, added to that neighbour's
node cost; the node keeps no edge. Without this, variable elimination would still join all the
neighbours of a one-config node into one table (the mask node's 24 attentions, for instance).
"""

from __future__ import annotations

import re
from collections import defaultdict

import numpy as np

from autopar.core.ir import Graph
from autopar.core.tables import CostTables

_BLOCK = re.compile(r"^(.*?(?:^|\.)\d+)(?:\.|$)")  # "model.layers.3.self_attn" -> "model.layers.3"
SHARED_BLOCKS = 3


def _block(module: str) -> str | None:
    m = _BLOCK.match(module or "")
    return m.group(1) if m else None


def kept_whole(graph: Graph) -> set[str]:
    """Memory-bound, parameter-free nodes that read no graph input or are read in >= 3 blocks."""
    from_inputs: set[str] = set()
    blocks: dict[str, set[str]] = defaultdict(set)
    for n in graph.nodes:
        if any(o.is_input or (o.is_node and o.source in from_inputs) for o in n.inputs):
            from_inputs.add(n.name)
        b = _block(n.module)
        for o in n.inputs:
            if o.is_node and b is not None:
                blocks[o.source].add(b)
    out = set()
    for n in graph.nodes:
        if n.flops or n.params or n.unsupported:
            continue
        if n.name not in from_inputs or len(blocks[n.name] - {_block(n.module)}) >= SHARED_BLOCKS:
            out.add(n.name)
    return out


def replicated_index(tables: CostTables, i: int) -> int:
    return next(j for j, c in enumerate(tables.configs[i]) if all(s == 1 for s in c.splits))


def fix_and_fold(tables: CostTables, fixed: dict[int, int] | None = None) -> CostTables:
    """Nodes in ``fixed`` limited to that one config; every one-config node's edges folded into its
    neighbours' costs (exact). Edge matrices between free nodes stay the same objects (no copy)."""
    fixed = fixed or {}
    configs, node_cost, memory = list(tables.configs), list(tables.node_cost), list(tables.memory)
    for i, j in fixed.items():
        configs[i] = [tables.configs[i][j]]
        node_cost[i] = np.asarray(tables.node_cost[i])[j:j + 1]
        if memory:
            memory[i] = np.asarray(tables.memory[i])[j:j + 1]
    pick = {i: fixed.get(i, 0) for i, c in enumerate(tables.configs) if i in fixed or len(c) == 1}
    edges = {}
    for (u, v), m in tables.edge_cost.items():
        if u in pick and v in pick:
            node_cost[u] = node_cost[u] + np.asarray(m)[pick[u], pick[v]]
        elif u in pick:
            node_cost[v] = node_cost[v] + np.asarray(m)[pick[u], :]
        elif v in pick:
            node_cost[u] = node_cost[u] + np.asarray(m)[:, pick[v]]
        else:
            edges[(u, v)] = m
    return CostTables(list(tables.nodes), configs, node_cost, edges, memory, tables.memory_capacity, tables.units)
