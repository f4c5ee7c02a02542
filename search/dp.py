"""PaSE's exact dynamic program, as variable elimination over numpy tables.

``dp(tables)`` returns a proven optimum of  sum_i node_cost[i][c_i] + sum_(u,v) edge[c_u, c_v]:
an elimination order (PaSE's GENERATESEQ, size-aware greedies, or a greedy that amortises work
over identical blocks, whichever leaves the least work to compute; search/order.py and
search/elimination.py), min-plus messages in bounded memory (search/minplus.py), identical repeated
blocks computed once (search/elimination.py), and back-substitution for the argmin.

Memory limit. The DP cannot carry a global sum-of-memory constraint, so it solves the Lagrangian
relaxation  min cost + lam * (memory - capacity)  exactly for a sequence of multipliers (the
breakpoint method: lam where the lines of the best infeasible and best feasible plan meet). Every
such optimum is a lower bound on the constrained optimum; every feasible plan seen, and what local
moves make of every plan seen (search/local.py), an upper bound. When they meet, the plan is
proven optimal (gap 0). When a duality gap remains (the knapsack is integral), the ILP finishes
the job if the problem is small enough for it (``Solution.search`` then reads "dp+ilp"), and
``Solution.gap`` reports what is left, never 0 unless proven.

No assignment fitting, or none of finite cost, raises ``autopar.core.errors.InfeasibleError``; tables
too big for the memory budget raise ``SearchTooLargeError`` before any table is built.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np

from autopar.core.tables import CostTables, Solution

from .common import (GAP_RTOL, Problem, SearchTooLargeError, check_feasible, no_finite_plan,
                     problem_of, relative_gap)
from .elimination import DEFAULT_MEMORY_BUDGET, EliminationPlan, choose_plan, execute, original_factors
from .local import descend, neighbours, repair

__all__ = ["dp", "dp_plan", "least_cost", "DEFAULT_MEMORY_BUDGET"]


@dataclass(frozen=True)
class _Point:
    """One plan the Lagrangian loop met: its exact cost and memory."""

    choice: tuple[int, ...]
    cost: float
    mem: float


def dp_plan(tables: CostTables, order: str = "auto", reuse: bool = True,
            memory_budget: float = DEFAULT_MEMORY_BUDGET) -> EliminationPlan:
    """The elimination plan ``dp`` would run (order, work, reuse, memory), without running it."""
    p = problem_of(tables)
    factors, _ = original_factors(p, p.node_cost)
    return choose_plan(p, factors, order, reuse, memory_budget)


def least_cost(tables: CostTables, max_work: float, order: str = "auto", reuse: bool = True,
               memory_budget: float = DEFAULT_MEMORY_BUDGET) -> float | None:
    """The exact optimum's cost ignoring memory, or None where its elimination plan's work is past
    ``max_work``: the plan is chosen once, checked, then run (``dp_plan`` and then ``dp`` would
    choose it twice, the greedy orders' search being as dear as the elimination on big tables)."""
    p = problem_of(tables)
    check_feasible(p)
    choice, _ = _unconstrained(p, p.node_cost, order, reuse, memory_budget, max_work)
    return None if choice is None else float(tables.total(choice))


def _unconstrained(p: Problem, node_cost, order: str, reuse: bool, budget: float, max_work: float = math.inf
                   ) -> tuple[list[int] | None, EliminationPlan]:
    """The optimum's choice ignoring memory and the plan that found it; the choice is None where
    the plan's work is past ``max_work`` (the plan is not run)."""
    factors, originals = original_factors(p, node_cost)
    pl = choose_plan(p, factors, order, reuse, budget)
    if pl.work > max_work:
        return None, pl
    choice, _ = execute(pl, originals, p.sizes)
    return choice, pl


def dp(tables: CostTables, order: str = "auto", reuse: bool = True,
       memory_budget: float = DEFAULT_MEMORY_BUDGET, ilp_fallback: bool = True,
       ilp_time_limit: float = 60.0, max_multipliers: int = 60) -> Solution:
    """The exact optimum; see the module docstring for the memory limit.

    ``order``: "auto" (least work among the candidates), "pase", "min_weight", "min_fill",
    "reuse" or "reuse_defer".
    ``reuse``: compute repeated identical steps once (exact; off only to test that it is).
    ``memory_budget``: bytes of DP tables allowed; above it SearchTooLargeError (a MemoryError).
    ``ilp_fallback``, ``ilp_time_limit``: under a memory limit the Lagrangian bound does not close,
    hand the rest to the ILP (when it is small enough) for at most that many seconds.
    ``max_multipliers``: Lagrangian re-solves after a fitting multiplier is found.
    """
    start = time.perf_counter()
    p = problem_of(tables)
    check_feasible(p)

    chosen_order = [order]

    def point(node_cost) -> _Point:
        # The first solve picks the order; the Lagrangian re-solves only shift node costs.
        choice, pl = _unconstrained(p, node_cost, chosen_order[0], reuse, memory_budget)
        chosen_order[0] = pl.order_name
        return _Point(tuple(choice), tables.total(choice), tables.total_memory(choice))

    x0 = point(p.node_cost)
    if not np.isfinite(x0.cost):
        raise no_finite_plan(p)
    # x0 is the optimum ignoring memory, unless problem_of priced out configs of infinite memory
    free = x0.cost if p.memory is None or all(np.isfinite(m).all() for m in p.memory) else None
    if p.memory is None or p.fits(x0.mem):
        return _solution(tables, x0, 0.0, "dp", start, free)
    nbrs = neighbours(p)

    def upper(x: _Point) -> _Point | None:
        """The best fitting plan local moves make of x (repaired first if it does not fit)."""
        start_from = list(x.choice) if p.fits(x.mem) else repair(p, list(x.choice), nbrs)
        if start_from is None:
            return None
        choice = descend(p, start_from, nbrs)
        return _Point(tuple(choice), tables.total(choice), tables.total_memory(choice))

    def least_memory() -> _Point:
        """The least-memory plan among those of finite cost: a DP over memory alone."""
        masked = replace(p, node_cost=tuple(np.where(np.isfinite(c), m, np.inf)
                                            for c, m in zip(p.node_cost, p.memory)),
                         edges={e: np.where(np.isfinite(m), 0.0, np.inf) for e, m in p.edges.items()})
        choice, _ = _unconstrained(masked, masked.node_cost, "auto", reuse, memory_budget)
        return _Point(tuple(choice), tables.total(choice), tables.total_memory(choice))

    best, lower = _lagrangian(p, x0, lambda lam: point(tuple(
        c + lam * np.where(np.isfinite(m), m, 0.0) for c, m in zip(p.node_cost, p.memory))),
        upper, least_memory, max_multipliers)
    gap = relative_gap(best.cost, lower)
    name = "dp"
    if gap > 0 and ilp_fallback:
        from .ilp import ilp_bounds  # the ILP closes what the Lagrangian bound could not
        try:
            choice, ilp_lower = ilp_bounds(tables, time_limit=ilp_time_limit,
                                           hint=list(best.choice))
        except SearchTooLargeError:
            choice, ilp_lower = None, -np.inf
        else:
            name = "dp+ilp"
        if choice is not None:
            cand = _Point(tuple(choice), tables.total(choice), tables.total_memory(choice))
            if p.fits(cand.mem) and cand.cost < best.cost:
                best = cand
        lower = max(lower, ilp_lower)
        gap = relative_gap(best.cost, lower)
    if not np.isfinite(best.cost):
        raise no_finite_plan(p)
    return _solution(tables, best, gap, name, start, free)


def _lagrangian(p: Problem, x0: _Point, solve, upper, least_memory, max_multipliers: int
                ) -> tuple[_Point, float]:
    """Best feasible plan found and the best Lagrangian lower bound (breakpoint method).

    ``solve(lam)`` is the DP's optimum with memory priced at lam; ``upper(x)`` turns any plan
    into a fitting one by local moves (or None): only the upper bound uses it; ``least_memory()``
    is the plan of least memory among those of finite cost, the fitting plan of last resort."""
    found: list[_Point] = []

    def seen(x: _Point) -> _Point:
        cand = upper(x)
        if cand is not None and p.fits(cand.mem):
            found.append(cand)
        return x

    cap = p.capacity
    lower = x0.cost  # lam = 0: the unconstrained optimum
    lo = x0
    # Above lam_max any memory saving outweighs every possible cost difference, so the DP's
    # optimum there has the least memory, which fits (check_feasible ran before).
    # Infinite entries (configs a cost model rules out) are never chosen, so they do not count.
    finite = [a[np.isfinite(a)] for a in (*p.node_cost, *p.edges.values())]
    span = sum(float(np.ptp(a)) for a in finite if a.size)
    levels = [np.unique(m[np.isfinite(m)]) for m in p.memory]
    step = min((float(np.diff(u).min()) for u in levels if u.size > 1), default=1.0)
    lam_max = 2.0 * (span + 1e-300) / step
    lam = min(lam_max, (span + 1e-300) / max(x0.mem - cap, 1e-300))
    hi = None
    while hi is None:
        x = seen(solve(lam))
        lower = max(lower, x.cost + lam * (x.mem - cap))
        if p.fits(x.mem):
            hi = x
        elif lam >= lam_max:
            # Sums of memory can differ by less than one node's step: settle it exactly.
            hi = least_memory()
            if not (p.fits(hi.mem) and np.isfinite(hi.cost)):
                raise no_finite_plan(p)
        else:
            lo, lam = x, min(lam * 4, lam_max)
    seen(x0)
    best = min([hi, *found], key=lambda y: y.cost)
    for _ in range(max_multipliers):
        if relative_gap(best.cost, lower) == 0.0 or lo.mem <= hi.mem:
            break
        lam = (hi.cost - lo.cost) / (lo.mem - hi.mem)
        if lam < 0:  # a fitting plan at least as cheap as an infeasible one: nothing to trade
            break
        x = seen(solve(lam))
        best = min([best, *found], key=lambda y: y.cost)
        value = x.cost + lam * (x.mem - cap)
        line = hi.cost + lam * (hi.mem - cap)
        lower = max(lower, value)
        if value >= line - GAP_RTOL * max(abs(line), abs(value), 1e-300):
            break  # lam maximises the dual: no multiplier gives a better bound
        if p.fits(x.mem):
            hi = x
        else:
            lo = x
    return min([best, *found], key=lambda y: y.cost), lower


def _solution(tables: CostTables, x: _Point, gap: float, name: str, start: float,
              free: float | None = None) -> Solution:
    return Solution(choice=list(x.choice), cost=x.cost, memory=x.mem, search=name,
                    seconds=time.perf_counter() - start, gap=gap, free_cost=free)
