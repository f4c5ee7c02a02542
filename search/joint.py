"""The joint schedule, Saturn-style: each job's option (parallel plan and device count) and every
unit's start time chosen together by one CP-SAT model (OR-tools), minimizing the makespan.

Variables: a Boolean per (job, option), exactly one true per job; per unit an optional interval
of that option's length; chain precedence between a job's units; one cumulative constraint (the
units running at any time hold at most P devices); the makespan at or after every end. Times
are integer ticks (durations rounded up, so the schedule is valid in real time too). A schedule
given as ``hint`` (Sharded-LRTF's) seeds the search, and the result is never worse than it: the
LRTF schedule is one of the model's solutions. Devices are assigned afterwards
(``schedule.assign_devices``): a cumulative-feasible schedule of rigid units always has free
devices for each unit, since devices are interchangeable.
"""

from __future__ import annotations

import math
import time

from .schedule import Job, Schedule, check_jobs, fitting_options, assign_devices, lower_bound

TICKS = 20_000  # resolution: the lower bound is this many ticks


def joint(jobs: list[Job], devices: int, time_limit: float = 10.0, hint: Schedule | None = None,
          workers: int = 2) -> Schedule:
    """Minimize the makespan over options and start times; ``status`` "optimal" when CP-SAT
    proved it (at tick resolution), else "feasible" with ``bound`` its proven lower bound."""
    from ortools.sat.python import cp_model  # loaded on first use

    start_clock = time.perf_counter()
    check_jobs(jobs, devices)
    lb = max(lower_bound(jobs, devices))
    tick = max(lb, 1e-12) / TICKS
    dur = {(j, o): max(1, math.ceil(opt.seconds / tick - 1e-9)) if opt.seconds > 0 else 0
           for j, job in enumerate(jobs) for o, opt in enumerate(job.options)}
    horizon = sum(max(dur[(j, o)] for o in fitting_options(job, devices)) * job.units for j, job in enumerate(jobs))
    m = cp_model.CpModel()
    makespan = m.new_int_var(0, horizon, "makespan")
    choose, starts, intervals, demands = {}, {}, [], []
    for j, job in enumerate(jobs):
        fit = fitting_options(job, devices)
        for o in fit:
            choose[(j, o)] = m.new_bool_var(f"x{j}_{o}")
        m.add_exactly_one(choose[(j, o)] for o in fit)
        for o in fit:
            prev_end = None
            for u in range(job.units):
                s = m.new_int_var(0, horizon, f"s{j}_{o}_{u}")
                e = m.new_int_var(0, horizon, f"e{j}_{o}_{u}")
                iv = m.new_optional_interval_var(s, dur[(j, o)], e, choose[(j, o)], f"i{j}_{o}_{u}")
                starts[(j, o, u)] = (s, e)
                intervals.append(iv)
                demands.append(job.options[o].devices)
                if prev_end is not None:
                    m.add(s >= prev_end).only_enforce_if(choose[(j, o)])
                prev_end = e
            m.add(makespan >= prev_end).only_enforce_if(choose[(j, o)])
    m.add_cumulative(intervals, demands, devices)
    # the lower bound on the tick grid (rounded lengths): a schedule that meets it is proven optimal
    work = sum(min(job.options[o].devices * dur[(j, o)] * job.units for o in fitting_options(job, devices))
               for j, job in enumerate(jobs))
    chain = max(min(dur[(j, o)] * job.units for o in fitting_options(job, devices)) for j, job in enumerate(jobs))
    m.add(makespan >= max(math.ceil(work / devices), chain))
    m.minimize(makespan)
    if hint is not None:
        _add_hint(m, jobs, hint, tick, choose, starts, dur)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 0
    status = solver.solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if hint is not None:
            return _fallback(hint, start_clock, "CP-SAT found no schedule in the time limit")
        raise TimeoutError(f"CP-SAT found no schedule of {len(jobs)} jobs in {time_limit} s")
    timed = []
    for (j, o), x in choose.items():
        if solver.boolean_value(x):
            for u in range(jobs[j].units):
                s = solver.value(starts[(j, o, u)][0]) * tick
                timed.append((j, u, o, s, s + jobs[j].options[o].seconds))
    slots = assign_devices(jobs, devices, _left_shift(jobs, devices, timed))
    optimal = status == cp_model.OPTIMAL
    out = Schedule(slots, devices, "joint (CP-SAT)", "optimal" if optimal else "feasible",
                   time.perf_counter() - start_clock, bound=max(lb, solver.best_objective_bound * tick))
    if hint is not None and hint.makespan < out.makespan:
        return _fallback(hint, start_clock, "CP-SAT's best was not better than the hint")
    return out


def _fallback(hint: Schedule, start_clock: float, why: str) -> Schedule:
    return Schedule(list(hint.slots), hint.devices, "joint (CP-SAT, kept the hint)", "feasible",
                    time.perf_counter() - start_clock, notes=[why])


def _add_hint(m, jobs, hint: Schedule, tick: float, choose, starts, dur) -> None:
    """The hint's options and starts, on the tick grid: starts scaled so the rounded-up
    durations still fit (a start at real time t goes to ceil(t / tick) plus the rounding so far)."""
    chosen = hint.options()
    for (j, o), x in choose.items():
        m.add_hint(x, chosen.get(j) == o)
    # re-time the hint in ticks: same order per device, rounded durations
    timed = [(s.job, s.unit, s.option, s.start, s.end) for s in hint.slots]
    ticked = _left_shift(jobs, hint.devices, timed, lambda j, o: dur[(j, o)])
    for j, u, o, s, _ in ticked:
        if (j, o, u) in starts:
            m.add_hint(starts[(j, o, u)][0], int(round(s)))
            m.add_hint(starts[(j, o, u)][1], int(round(s)) + dur[(j, o)])


def _left_shift(jobs, devices, timed, length=None):
    """Keep the units' order (by start) and start each as early as its chain and the device count
    allow: never later than before, so never a longer makespan (``length``: durations to use).
    A unit can only move to its chain's ready time or to where a placed unit ends (where device
    use drops), and its old start stays possible: every unit placed before it only moved left."""
    length = length or (lambda j, o: jobs[j].options[o].seconds)
    out, ends = [], {}
    for j, u, o, _, _ in sorted(timed, key=lambda t: (t[3], t[0], t[1])):
        need, d = jobs[j].options[o].devices, length(j, o)
        ready = ends.get((j, u - 1), 0.0)
        start = next(c for c in sorted({ready} | {p[4] for p in out if p[4] > ready})
                     if _fits(out, jobs, devices, c, c + d, need))
        out.append((j, u, o, start, start + d))
        ends[(j, u)] = start + d
    return out


def _fits(placed, jobs, devices, start, end, need) -> bool:
    points = [start] + [p[3] for p in placed if start < p[3] < end]
    return all(sum(jobs[p[0]].options[p[2]].devices for p in placed if p[3] <= t < p[4]) + need <= devices
               for t in points)
