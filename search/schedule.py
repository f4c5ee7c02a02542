"""Scheduling many training jobs on P devices: the data, the lower bound, Hydra's Sharded-LRTF,
device assignment and an exhaustive reference.

A job is one model (or one fused group of models) to train; it is a chain of ``units`` (chunks
of its training steps, or Hydra's shard tasks) that run one after another, and it runs in one of
its ``options``: a device count (its parallel plan's width) and the seconds one unit takes on
that many devices. Devices are identical. A schedule gives every unit a start time and devices;
it is valid when no device runs two units at once, every unit follows its predecessor, and all
units of a job use one option. Pure algorithms on this data: no model, no cost model.

Sharded-LRTF (Hydra, Nagrecha et al.): whenever a device is free, give it the next unit of the
job with the Longest Remaining Time First, among the jobs not running; every job in its
one-device option (a model too large for a device is cut into shards that run one at a time,
its other shards spilled to host memory and the next one prefetched). Prefetching is priced into
the unit times by the planner (a unit's load overlaps the unit before it), so the scheduler only
orders units.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Option:
    """One way to run a job: ``devices`` at once, ``seconds`` per unit; ``label`` says which plan."""

    devices: int
    seconds: float
    label: str = ""


@dataclass(frozen=True)
class Job:
    name: str
    options: tuple[Option, ...]
    units: int = 1

    def __post_init__(self) -> None:
        if self.units < 1 or not self.options:
            raise ValueError(f"job {self.name!r} needs at least one unit and one option")
        for o in self.options:
            if o.devices < 1 or not (o.seconds >= 0) or math.isinf(o.seconds):
                raise ValueError(f"job {self.name!r}: option {o} needs devices >= 1 and finite seconds >= 0")

    def area(self, option: int) -> float:
        o = self.options[option]
        return o.devices * o.seconds * self.units

    def length(self, option: int) -> float:
        return self.options[option].seconds * self.units


@dataclass(frozen=True)
class Slot:
    """Unit ``unit`` of job ``job`` in option ``option`` on ``devices`` over [start, end)."""

    job: int
    unit: int
    option: int
    start: float
    end: float
    devices: tuple[int, ...]


@dataclass
class Schedule:
    slots: list[Slot]
    devices: int
    method: str
    status: str = "heuristic"  # "optimal" (proven), "feasible" (solver stopped), "heuristic"
    seconds: float = 0.0  # time the scheduler itself took
    bound: float = 0.0  # a proven lower bound on the optimal makespan, where the method has one
    notes: list[str] = field(default_factory=list)

    @property
    def makespan(self) -> float:
        return max((s.end for s in self.slots), default=0.0)

    def options(self) -> dict[int, int]:
        return {s.job: s.option for s in self.slots}

    def timeline(self) -> dict[int, list[Slot]]:
        """Per device, its slots in time order."""
        out: dict[int, list[Slot]] = {d: [] for d in range(self.devices)}
        for s in sorted(self.slots, key=lambda s: s.start):
            for d in s.devices:
                out[d].append(s)
        return out


def lower_bound(jobs: list[Job], devices: int) -> tuple[float, float]:
    """(work bound, chain bound): no schedule beats either. Work: the least device-seconds of
    every job (its cheapest option) over all devices; chain: the longest job's shortest run."""
    check_jobs(jobs, devices)
    work = sum(min(j.area(o) for o in fitting_options(j, devices)) for j in jobs) / devices
    chain = max((min(j.length(o) for o in fitting_options(j, devices)) for j in jobs), default=0.0)
    return work, chain


def fitting_options(job: Job, devices: int) -> list[int]:
    return [i for i, o in enumerate(job.options) if o.devices <= devices]


def check_jobs(jobs: list[Job], devices: int) -> None:
    if devices < 1:
        raise ValueError(f"devices must be >= 1, not {devices}")
    for j in jobs:
        if not fitting_options(j, devices):
            raise ValueError(f"job {j.name!r} has no option on at most {devices} devices")


def assign_devices(jobs: list[Job], devices: int, timed: list[tuple[int, int, int, float, float]]) -> list[Slot]:
    """Devices for (job, unit, option, start, end) tuples whose device use never exceeds
    ``devices``: in start order, each unit takes free devices, its predecessor's first (no move)."""
    free_at = [0.0] * devices
    last: dict[int, tuple[int, ...]] = {}
    slots = []
    eps = 1e-9 * max((t[4] for t in timed), default=1.0)
    for job, unit, option, start, end in sorted(timed, key=lambda t: (t[3], t[0], t[1])):
        need = jobs[job].options[option].devices
        free = [d for d in range(devices) if free_at[d] <= start + eps]
        prefer = [d for d in last.get(job, ()) if d in free]
        chosen = (prefer + [d for d in free if d not in prefer])[:need]
        if len(chosen) < need:
            raise ValueError(f"more than {devices} devices busy at {start:.6g} s: not a valid schedule")
        for d in chosen:
            free_at[d] = end
        last[job] = tuple(sorted(chosen))
        slots.append(Slot(job, unit, option, start, end, tuple(sorted(chosen))))
    return slots


def validate(jobs: list[Job], schedule: Schedule) -> None:
    """Raise ValueError unless ``schedule`` runs every unit once, in chain order, one option per
    job, with the option's duration and device count, and no device double-booked."""
    eps = 1e-9 * max(schedule.makespan, 1.0)
    seen = {(s.job, s.unit) for s in schedule.slots}
    want = {(j, u) for j, job in enumerate(jobs) for u in range(job.units)}
    if seen != want or len(schedule.slots) != len(want):
        raise ValueError("the schedule does not run every unit exactly once")
    by = {(s.job, s.unit): s for s in schedule.slots}
    for j, job in enumerate(jobs):
        opts = {by[(j, u)].option for u in range(job.units)}
        if len(opts) != 1:
            raise ValueError(f"job {job.name!r} switches options")
        for u in range(job.units):
            s = by[(j, u)]
            o = job.options[s.option]
            if len(set(s.devices)) != o.devices or abs((s.end - s.start) - o.seconds) > eps:
                raise ValueError(f"job {job.name!r} unit {u} does not match its option")
            if u and s.start < by[(j, u - 1)].end - eps:
                raise ValueError(f"job {job.name!r} unit {u} starts before unit {u - 1} ends")
    for d, slots in schedule.timeline().items():
        for a, b in zip(slots, slots[1:]):
            if b.start < a.end - eps:
                raise ValueError(f"device {d} runs two units at once at {b.start:.6g} s")


def one_device_option(job: Job) -> int:
    """The option Sharded-LRTF runs a job in: its fastest one-device option (else its narrowest)."""
    ones = [i for i, o in enumerate(job.options) if o.devices == 1]
    if ones:
        return min(ones, key=lambda i: job.options[i].seconds)
    return min(range(len(job.options)), key=lambda i: (job.options[i].devices, job.options[i].seconds))


def lrtf(jobs: list[Job], devices: int, options: list[int] | None = None) -> Schedule:
    """Sharded-LRTF: event-driven list scheduling, the job with the longest remaining time first.

    ``options``: the option per job (default ``one_device_option``). A job wider than one device
    waits until that many devices are free; a device stays idle only when no waiting job fits."""
    import time

    start_clock = time.perf_counter()
    check_jobs(jobs, devices)
    options = options if options is not None else [one_device_option(j) for j in jobs]
    remaining = [jobs[j].length(options[j]) for j in range(len(jobs))]
    next_unit = [0] * len(jobs)
    running: list[tuple[float, int, tuple[int, ...]]] = []  # (end, job, devices)
    free = list(range(devices))
    now = 0.0
    slots: list[Slot] = []
    while True:
        waiting = sorted((j for j in range(len(jobs)) if next_unit[j] < jobs[j].units
                          and all(r[1] != j for r in running)), key=lambda j: (-remaining[j], j))
        for j in waiting:  # longest remaining first; a wide job that does not fit lets others go
            need = jobs[j].options[options[j]].devices
            if need <= len(free):
                free.sort()
                devs, free = tuple(free[:need]), free[need:]
                dur = jobs[j].options[options[j]].seconds
                slots.append(Slot(j, next_unit[j], options[j], now, now + dur, devs))
                heapq.heappush(running, (now + dur, j, devs))
                next_unit[j] += 1
                remaining[j] -= dur
        if not running:
            break
        now, _, devs = heapq.heappop(running)
        free.extend(devs)
        while running and running[0][0] <= now:
            free.extend(heapq.heappop(running)[2])
    return Schedule(slots, devices, "sharded-lrtf", "heuristic", time.perf_counter() - start_clock)


def one_at_a_time(jobs: list[Job], devices: int, option_of) -> Schedule:
    """Every job alone on all devices in turn (the practice both papers compare against):
    ``option_of(job) -> option index`` picks the option each job runs in."""
    now, slots = 0.0, []
    for j, job in enumerate(jobs):
        o = option_of(job)
        for u in range(job.units):
            dur = job.options[o].seconds
            slots.append(Slot(j, u, o, now, now + dur, tuple(range(job.options[o].devices))))
            now += dur
    return Schedule(slots, devices, "one at a time", "heuristic")


def brute(jobs: list[Job], devices: int, max_orders: int = 200_000) -> Schedule:
    """The optimal makespan by exhaustion, for tests on tiny cases.

    Every option choice, then every order of placing units (chains respected), each unit started
    at the earliest of {0, the end of a placed unit} where it fits: some optimal schedule is
    found this way (shift every unit of an optimal schedule left as far as it goes; each then
    starts at 0 or where an earlier-starting unit ends)."""
    check_jobs(jobs, devices)
    tasks = [(j, u) for j, job in enumerate(jobs) for u in range(job.units)]
    best: tuple[float, list] = (math.inf, [])
    choices = [fitting_options(j, devices) for j in jobs]
    orders = 0
    for combo in itertools.product(*choices):
        for order in itertools.permutations(tasks):
            orders += 1
            if orders > max_orders:
                raise MemoryError(f"brute force over more than {max_orders} orders")
            if any(order.index((j, u - 1)) > order.index((j, u)) for j, u in order if u):
                continue
            for placed in _place_all(jobs, devices, combo, list(order)):
                span = max(p[4] for p in placed)
                if span < best[0] - 1e-12:
                    best = (span, placed)
    slots = assign_devices(jobs, devices, best[1])
    return Schedule(slots, devices, "brute force", "optimal", bound=best[0])


def _place_all(jobs, devices, combo, order):
    """Every way to place ``order`` unit by unit at candidate starts (semi-active schedules)."""
    def usage_ok(placed, start, end, need):
        points = [start] + [p[3] for p in placed if start < p[3] < end]
        return all(sum(jobs[p[0]].options[p[2]].devices for p in placed if p[3] <= t < p[4]) + need <= devices
                   for t in points)

    def rec(i, placed):
        if i == len(order):
            yield list(placed)
            return
        j, u = order[i]
        o = jobs[j].options[combo[j]]
        ready = max((p[4] for p in placed if p[0] == j and p[1] == u - 1), default=0.0)
        for start in sorted({0.0, ready} | {p[4] for p in placed}):
            if start < ready or not usage_ok(placed, start, start + o.seconds, o.devices):
                continue
            placed.append((j, u, combo[j], start, start + o.seconds))
            yield from rec(i + 1, placed)
            placed.pop()

    yield from rec(0, [])
