"""What every exact search shares: checking the tables, the memory limit, and the errors.

Infeasibility is reported the same way by every search: ``autopar.core.errors.InfeasibleError``, when
no assignment fits the memory capacity or every one that fits has an infinite cost (cost models
price configs they rule out at inf), with ``min_memory_per_device`` set to the least memory any assignment needs (memory is a sum of per-node
terms, so that minimum is the sum of per-node minima and needs no search at all).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autopar.core.errors import AutoparError, InfeasibleError
from autopar.core.tables import CostTables

# Relative slack when comparing a plan's memory with the capacity: sums of bytes in float64.
MEMORY_RTOL = 1e-12
# Bounds closer than this (relative) are equal: sums taken in different orders differ by ulps.
GAP_RTOL = 1e-10


class SearchTooLargeError(AutoparError, ValueError, MemoryError):
    """The exact search would need more memory (or more combinations) than its budget allows.

    A ValueError (the input is too big for this search) and a MemoryError (what it protects).
    """


@dataclass(frozen=True)
class Problem:
    """The tables as plain float64 arrays, checked once so the searches can trust their shapes."""

    sizes: tuple[int, ...]
    node_cost: tuple[np.ndarray, ...]
    edges: dict[tuple[int, int], np.ndarray]
    memory: tuple[np.ndarray, ...] | None  # None: no memory limit applies
    capacity: float

    @property
    def n(self) -> int:
        return len(self.sizes)

    def min_memory(self) -> float:
        return 0.0 if self.memory is None else float(sum(m.min() for m in self.memory))

    def fits(self, mem: float) -> bool:
        return self.memory is None or mem <= self.capacity * (1 + MEMORY_RTOL)


def problem_of(tables: CostTables) -> Problem:
    """Check shapes and convert; raise ValueError naming the first inconsistency."""
    n = len(tables.nodes)
    if len(tables.configs) != n or len(tables.node_cost) != n:
        raise ValueError(f"CostTables: {n} nodes but {len(tables.configs)} config lists and "
                         f"{len(tables.node_cost)} node-cost vectors")
    sizes = tuple(len(c) for c in tables.configs)
    node_cost = []
    for i, (k, vec) in enumerate(zip(sizes, tables.node_cost)):
        a = np.asarray(vec, dtype=np.float64)
        if k == 0 or a.shape != (k,):
            raise ValueError(f"node {i} ({tables.nodes[i]}): {k} configs, node cost shape {a.shape}")
        node_cost.append(a)
    edges: dict[tuple[int, int], np.ndarray] = {}
    for (u, v), mat in tables.edge_cost.items():
        a = np.asarray(mat, dtype=np.float64)
        if not (0 <= u < v < n) or a.shape != (sizes[u], sizes[v]):
            raise ValueError(f"edge {(u, v)}: needs 0 <= u < v < {n} and shape "
                             f"{(sizes[u] if 0 <= u < n else '?', sizes[v] if 0 <= v < n else '?')}, "
                             f"got shape {a.shape}")
        edges[(u, v)] = a
    memory = None
    capacity = float(tables.memory_capacity)
    if tables.memory and math.isfinite(capacity):
        if len(tables.memory) != n:
            raise ValueError(f"CostTables: {n} nodes but {len(tables.memory)} memory vectors")
        memory = []
        for i, (k, vec) in enumerate(zip(sizes, tables.memory)):
            a = np.asarray(vec, dtype=np.float64)
            if a.shape != (k,):
                raise ValueError(f"node {i}: {k} configs, memory shape {a.shape}")
            memory.append(a)
        memory = tuple(memory)
        # A config that needs infinite memory never fits: price it out, so no multiplier
        # (including 0) ever picks it and lam * inf never meets a finite cost.
        # (nodes sharing their cost and memory arrays keep sharing the result: the DP's
        # interning of equal tables then needs no comparison)
        masked: dict[tuple[int, int], np.ndarray] = {}
        for c, m in zip(node_cost, memory):
            if (id(c), id(m)) not in masked:
                masked[(id(c), id(m))] = np.where(np.isfinite(m), c, np.inf)
        node_cost = [masked[(id(c), id(m))] for c, m in zip(node_cost, memory)]
    return Problem(sizes, tuple(node_cost), edges, memory, capacity)


def check_feasible(p: Problem) -> None:
    """Raise InfeasibleError when even the least-memory assignment exceeds the capacity."""
    least = p.min_memory()
    if not p.fits(least):
        raise InfeasibleError(
            f"no assignment fits: the least memory per device is {least:.6g}, the capacity "
            f"{p.capacity:.6g}; use more devices or a space with finer splits",
            min_memory_per_device=least)


def no_finite_plan(p: Problem) -> InfeasibleError:
    """The error for tables whose every assignment (that fits) has an infinite cost: the cost
    model ruled out every combination, which is no plan at all, not a plan of infinite cost."""
    return InfeasibleError("every assignment that fits has an infinite cost (the cost model "
                           "rules out all combinations); check the configs and the mesh",
                           min_memory_per_device=p.min_memory())


def relative_gap(upper: float, lower: float) -> float:
    """(upper - lower) / |upper|, 0 when the bounds meet to float precision."""
    if not math.isfinite(upper):
        return 0.0 if upper == lower else math.inf
    if upper - lower <= GAP_RTOL * max(abs(upper), abs(lower)):
        return 0.0
    return float((upper - lower) / max(abs(upper), 1e-300))
