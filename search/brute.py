"""Exhaustive search: the reference the exact searches are tested against.

It evaluates every assignment at once with numpy broadcasting (one axis per node), so it is short
enough to check by eye; ties go to the first assignment in lexicographic order.
"""

from __future__ import annotations

import math
import time

import numpy as np

from autopar.core.tables import CostTables, Solution

from .common import MEMORY_RTOL, SearchTooLargeError, check_feasible, no_finite_plan, problem_of

MAX_COMBINATIONS = 10**6


def brute(tables: CostTables, max_combinations: int = MAX_COMBINATIONS) -> Solution:
    """The optimum over the Cartesian product of config sets, under the memory capacity if any.

    Raises SearchTooLargeError (a MemoryError) above ``max_combinations`` assignments and
    ``autopar.core.errors.InfeasibleError`` when no assignment fits in memory or has a finite cost.
    """
    start = time.perf_counter()
    p = problem_of(tables)
    count = math.prod(p.sizes)
    if count > max_combinations:
        raise SearchTooLargeError(f"brute force over {count} assignments (limit {max_combinations})")
    check_feasible(p)

    def along(i: int, vec: np.ndarray) -> np.ndarray:
        shape = [1] * p.n
        shape[i] = p.sizes[i]
        return vec.reshape(shape)

    total = np.zeros(p.sizes)
    for i, vec in enumerate(p.node_cost):
        total = total + along(i, vec)
    for (u, v), mat in p.edges.items():
        shape = [1] * p.n
        shape[u], shape[v] = p.sizes[u], p.sizes[v]
        total = total + mat.reshape(shape)
    if p.memory is not None:
        mem = sum((along(i, m) for i, m in enumerate(p.memory)), np.zeros(p.sizes))
        total = np.where(mem <= p.capacity * (1 + MEMORY_RTOL), total, np.inf)
    flat = int(np.argmin(total))
    if not np.isfinite(total.flat[flat]):
        raise no_finite_plan(p)
    choice = [int(c) for c in np.unravel_index(flat, p.sizes)] if p.n else []
    return Solution(choice=choice, cost=tables.total(choice), memory=tables.total_memory(choice),
                    search="brute", seconds=time.perf_counter() - start, gap=0.0)
