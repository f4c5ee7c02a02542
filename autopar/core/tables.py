"""The numbers a search minimizes, and what a search returns.

This module is the wall between cost models and searches: a cost model fills ``CostTables`` and
never imports a search; a search reads ``CostTables`` and never imports a cost model.

Units are whatever the cost model chose (seconds for ``analytic``/``profiled``, PaSE's
FLOP-equivalents for ``pase``); a search only adds and compares them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Config:
    """How one node is split.

    ``splits[i]`` is the number of parts dim ``i`` of the node's iteration space is cut into.
    ``mesh_axes[i]`` names the device-mesh axes (indices into the mesh shape) that cut dim ``i``,
    major first; their sizes multiply to ``splits[i]``. Mesh axes assigned to no dim replicate.
    The PaSE space has no mesh (``mesh_axes == ()``): it only counts parts.
    """

    splits: tuple[int, ...]
    mesh_axes: tuple[tuple[int, ...], ...] = ()

    @property
    def devices(self) -> int:
        return math.prod(self.splits)


@dataclass(frozen=True)
class Mesh:
    """The logical device mesh the default space maps splits onto.

    ``shape`` holds the prime factors of the device count; ``level[a]`` is 0 for an axis whose
    devices share a node and k > 0 for one that crosses node boundaries (outer axes first).
    """

    shape: tuple[int, ...]
    level: tuple[int, ...] = ()

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass
class CostTables:
    """Per-node cost vectors, per-edge cost matrices and per-node memory vectors.

    ``edge_cost[(u, v)]`` has shape ``(len(configs[u]), len(configs[v]))`` with ``u < v`` (indices
    into ``nodes``); parallel edges between the same two nodes are already summed into one matrix.
    ``memory[i][c]`` is the bytes per device node ``i`` holds under config ``c``; a plan fits when
    the sum over nodes is at most ``memory_capacity``.
    """

    nodes: list[str]
    configs: list[list[Config]]
    node_cost: list[np.ndarray]
    edge_cost: dict[tuple[int, int], np.ndarray]
    memory: list[np.ndarray] = field(default_factory=list)
    memory_capacity: float = math.inf
    units: str = "s"

    def total(self, choice: list[int] | tuple[int, ...]) -> float:
        """The objective of one assignment: node costs plus edge costs."""
        t = sum(float(self.node_cost[i][c]) for i, c in enumerate(choice))
        t += sum(float(m[choice[u], choice[v]]) for (u, v), m in self.edge_cost.items())
        return t

    def total_memory(self, choice: list[int] | tuple[int, ...]) -> float:
        if not self.memory:
            return 0.0
        return sum(float(self.memory[i][c]) for i, c in enumerate(choice))


@dataclass
class Solution:
    """A search's answer: one config index per node, its cost, and how sure the search is."""

    choice: list[int]
    cost: float
    memory: float
    search: str  # "dp", "ilp", "brute", ...
    seconds: float
    gap: float = 0.0  # relative optimality gap; 0.0 = proven optimal
    detail: str = ""  # what the search was restricted to, if anything (e.g. values kept whole)
    # The least cost over all assignments ignoring the memory capacity, when the search computed
    # it on the way (the DP's first solve); None when it did not. Lets a caller ask "does memory
    # bind?" without a second search.
    free_cost: float | None = None


def restrict(tables: CostTables, keep: list[list[int]]) -> CostTables:
    """The same problem with node ``i`` limited to configs ``keep[i]`` (indices into its list).

    Baselines and pinned plans are restrictions: data parallelism keeps one config per node, the
    expert plan keeps the Megatron-compatible ones, and the same exact search runs on what is left.
    A ``Solution`` of the restricted tables maps back with ``keep[i][choice[i]]``.
    """
    if any(len(k) == 0 for k in keep):
        empty = [tables.nodes[i] for i, k in enumerate(keep) if not k]
        raise ValueError(f"restriction leaves no config for node(s) {', '.join(empty[:5])}")
    idx = [np.asarray(k, dtype=np.intp) for k in keep]
    return CostTables(
        nodes=list(tables.nodes),
        configs=[[tables.configs[i][j] for j in k] for i, k in enumerate(keep)],
        node_cost=[np.asarray(c)[idx[i]] for i, c in enumerate(tables.node_cost)],
        edge_cost={(u, v): np.asarray(m)[np.ix_(idx[u], idx[v])] for (u, v), m in tables.edge_cost.items()},
        memory=[np.asarray(m)[idx[i]] for i, m in enumerate(tables.memory)],
        memory_capacity=tables.memory_capacity,
        units=tables.units,
    )
