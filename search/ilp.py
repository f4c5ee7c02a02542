"""The same problem as an integer program, solved by HiGHS through OR-tools' MathOpt.

Variables: x[i][c] in {0, 1} with sum_c x[i][c] = 1 per node, and for every edge (u, v) whose
matrix is not constant, y[a, b] in [0, 1] with the marginal ("local polytope") constraints
sum_b y[a, b] = x[u][a] and sum_a y[a, b] = x[v][b]. With x integral these force y to be the
one-hot of the chosen pair, so y needs no integrality; the marginals make the LP relaxation as
tight as the pairwise linearisation gets (tree-shaped graphs are already integral).

Memory, when a capacity is given, is one knapsack row sum_i sum_c mem[i][c] x[i][c] <= capacity.
Costs are divided by their largest entry before solving (cost models use seconds, ~1e-6, or
FLOP-equivalents, ~1e12, and solver tolerances are absolute); the reported cost is re-evaluated
on the original tables. ``Solution.gap`` is 0.0 only when HiGHS proved optimality with zero gap
tolerances, otherwise (cost - best bound) / cost. Infinite entries (configs or pairs a cost model
rules out) become variables fixed at 0. No fitting assignment of finite cost raises
InfeasibleError;
no solution within the time limit raises TimeoutError.
"""

from __future__ import annotations

import datetime
import time

import numpy as np

from autopar.core.tables import CostTables, Solution

from .common import SearchTooLargeError, check_feasible, no_finite_plan, problem_of, relative_gap

MAX_VARIABLES = 500_000


def ilp(tables: CostTables, time_limit: float = 60.0,
        max_variables: int = MAX_VARIABLES, solution_limit: int | None = None) -> Solution:
    """Solve to proven optimality or until ``time_limit`` seconds, or until HiGHS has found
    ``solution_limit`` improving plans (a limit that stops at the same plan on every run, unlike
    a time); the gap says how far from proven the plan is."""
    start = time.perf_counter()
    choice, lower, optimal = _solve(tables, time_limit, max_variables, None, solution_limit)
    cost = tables.total(choice)
    gap = 0.0 if optimal else relative_gap(cost, lower)
    return Solution(choice=choice, cost=cost, memory=tables.total_memory(choice), search="ilp",
                    seconds=time.perf_counter() - start, gap=gap)


def ilp_bounds(tables: CostTables, time_limit: float = 60.0, hint: list[int] | None = None,
               max_variables: int = MAX_VARIABLES) -> tuple[list[int] | None, float]:
    """(best choice or None, proven lower bound on the optimum): for the DP's memory fallback."""
    try:
        choice, lower, optimal = _solve(tables, time_limit, max_variables, hint)
    except TimeoutError:
        return None, -np.inf
    return choice, (tables.total(choice) if optimal else lower)


def _solve(tables: CostTables, time_limit: float, max_variables: int,
           hint: list[int] | None, solution_limit: int | None = None) -> tuple[list[int], float, bool]:
    from ortools.math_opt.python import mathopt  # loaded on first use: 0.4 s of imports

    p = problem_of(tables)
    check_feasible(p)
    # Infinite entries (configs a cost model rules out) become variables fixed at 0.
    varying = {e: m for e, m in p.edges.items()
               if m.size and not (np.isfinite(m).all() and np.ptp(m) == 0)}
    count = sum(p.sizes) + sum(m.size for m in varying.values())
    if count > max_variables:
        raise SearchTooLargeError(f"the ILP would have {count} variables (limit {max_variables})")
    finite = [np.abs(a[np.isfinite(a)]) for a in (*p.node_cost, *p.edges.values())]
    scale = max([float(a.max()) for a in finite if a.size] + [0.0]) or 1.0
    offset = sum(float(m.flat[0]) for e, m in p.edges.items() if e not in varying)

    model = mathopt.Model(name="autopar")
    usable = [np.isfinite(c) & (np.isfinite(m) if p.memory is not None else True)
              for c, m in zip(p.node_cost, p.memory or p.node_cost)]
    x = [[model.add_variable(lb=0.0, ub=float(ok), is_integer=True) for ok in row]
         for row in usable]
    terms = []
    for i, vec in enumerate(p.node_cost):
        model.add_linear_constraint(mathopt.fast_sum(x[i]) == 1)
        terms += [(c / scale) * var for c, var, ok in zip(vec.tolist(), x[i], usable[i]) if c and ok]
    for (u, v), mat in varying.items():
        ku, kv = mat.shape
        ok = np.isfinite(mat).tolist()
        y = [[model.add_variable(lb=0.0, ub=float(ok[a][b])) for b in range(kv)] for a in range(ku)]
        for a in range(ku):
            model.add_linear_constraint(mathopt.fast_sum(y[a]) == x[u][a])
        for b in range(kv):
            model.add_linear_constraint(mathopt.fast_sum(y[a][b] for a in range(ku)) == x[v][b])
        scaled = (mat / scale).tolist()
        terms += [scaled[a][b] * y[a][b] for a in range(ku) for b in range(kv)
                  if scaled[a][b] and ok[a][b]]
    if p.memory is not None:
        # Per-node minima moved to the right-hand side keep the row well scaled.
        base = p.min_memory()
        room = p.capacity - base
        extra = [np.where(np.isfinite(m), m - m.min(), 0.0) for m in p.memory]
        norm = max(room, max(float(e.max()) for e in extra), 1e-300)
        model.add_linear_constraint(mathopt.fast_sum(
            (e[c] / norm) * x[i][c]
            for i, e in enumerate(extra) for c in range(len(e)) if e[c] > 0) <= room / norm)
    model.minimize(mathopt.fast_sum(terms))

    params = mathopt.SolveParameters(time_limit=datetime.timedelta(seconds=time_limit),
                                     solution_limit=solution_limit,
                                     relative_gap_tolerance=0.0, absolute_gap_tolerance=0.0)
    # Tight tolerances: the rounded choice must keep the memory row (checked again below).
    params.highs.double_options["mip_feasibility_tolerance"] = 1e-9
    params.highs.double_options["primal_feasibility_tolerance"] = 1e-9
    model_params = None
    if hint is not None:
        model_params = mathopt.ModelSolveParameters(solution_hints=[mathopt.SolutionHint(
            variable_values={x[i][c]: float(c == hint[i]) for i in range(p.n)
                             for c in range(p.sizes[i])})])
    try:
        result = mathopt.solve(model, mathopt.SolverType.HIGHS, params=params,
                               model_params=model_params)
    except Exception:  # noqa: BLE001 - a solver that rejects hints: solve without them
        if model_params is None:
            raise
        result = mathopt.solve(model, mathopt.SolverType.HIGHS, params=params)
    reason = result.termination.reason
    if reason == mathopt.TerminationReason.INFEASIBLE:
        raise no_finite_plan(p)
    if not result.has_primal_feasible_solution():
        raise TimeoutError(f"the ILP found no solution within {time_limit} s ({reason.name})")
    values = result.variable_values()
    choice = [int(np.argmax([values[var] for var in row])) for row in x]
    if p.memory is not None and not p.fits(tables.total_memory(choice)):
        raise RuntimeError("the ILP's rounded plan exceeds the memory capacity by more than the "
                           "solver's tolerance; rescale the memory units")
    lower = result.termination.objective_bounds.dual_bound * scale + offset
    return choice, float(lower), reason == mathopt.TerminationReason.OPTIMAL
