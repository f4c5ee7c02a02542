"""Scheduling many jobs: every schedule is valid and no better than the lower bound;
the joint CP-SAT schedule is the optimum on small cases (against brute force) and never worse
than Sharded-LRTF; the validity check itself catches a double-booked device."""

from __future__ import annotations

import random

import pytest

from autopar.search.joint import joint
from autopar.search.schedule import (Job, Option, Schedule, Slot, assign_devices, brute, lower_bound, lrtf,
                                     one_at_a_time, validate)


def _random_jobs(rng: random.Random, n: int, devices: int, units: int, integer: bool = True) -> list[Job]:
    jobs = []
    for i in range(n):
        one = rng.randint(1, 4) if integer else rng.uniform(0.5, 4.0)
        options = [Option(1, float(one), "one")]
        for g in (2, 4):
            if g <= devices and rng.random() < 0.6:
                options.append(Option(g, float(max(1, round(one / g * rng.uniform(1.0, 1.6)))) if integer
                                      else one / g * rng.uniform(1.0, 1.6), f"dp{g}"))
        jobs.append(Job(f"j{i}", tuple(options), rng.randint(1, units)))
    return jobs


@pytest.mark.parametrize("seed", range(12))
def test_joint_is_optimal_on_small_cases_and_lrtf_is_no_better(seed):
    rng = random.Random(seed)
    devices = rng.choice([2, 3])
    jobs = _random_jobs(rng, rng.randint(2, 3), devices, units=2)
    best = brute(jobs, devices)
    validate(jobs, best)
    heuristic = lrtf(jobs, devices)
    exact = joint(jobs, devices, time_limit=5.0, hint=heuristic)
    for s in (heuristic, exact):
        validate(jobs, s)
        assert s.makespan >= best.makespan - 1e-9
        assert s.makespan >= max(lower_bound(jobs, devices)) - 1e-9
    assert exact.makespan == pytest.approx(best.makespan, rel=1e-3)
    assert exact.status == "optimal" or exact.method.endswith("kept the hint)")


def test_lrtf_is_longest_first_and_the_joint_schedule_beats_it():
    """Five one-device jobs 3, 3, 2, 2, 2 on two devices: longest first puts the 3s side by side
    and ends at 7; the optimum pairs 3 + 3 and 2 + 2 + 2 and ends at 6."""
    jobs = [Job(f"j{i}", (Option(1, t),)) for i, t in enumerate([2.0, 3.0, 2.0, 3.0, 2.0])]
    heuristic = lrtf(jobs, 2)
    assert [s.job for s in sorted(heuristic.slots, key=lambda s: (s.start, s.devices))][:2] == [1, 3]
    assert heuristic.makespan == pytest.approx(7.0)
    assert joint(jobs, 2, hint=heuristic).makespan == pytest.approx(6.0, rel=1e-3)
    assert brute(jobs, 2).makespan == pytest.approx(6.0)


@pytest.mark.parametrize("seed", range(4))
def test_joint_never_worse_than_lrtf_on_larger_cases(seed):
    rng = random.Random(100 + seed)
    jobs = _random_jobs(rng, 12, 8, units=4, integer=False)
    heuristic = lrtf(jobs, 8)
    exact = joint(jobs, 8, time_limit=2.0, hint=heuristic)
    validate(jobs, exact)
    assert exact.makespan <= heuristic.makespan + 1e-9
    assert exact.makespan >= max(lower_bound(jobs, 8)) - 1e-9


def test_lower_bound_is_work_over_devices_and_the_longest_chain():
    jobs = [Job("a", (Option(1, 4.0), Option(2, 2.5)), units=2), Job("b", (Option(1, 1.0),))]
    work, chain = lower_bound(jobs, 2)
    assert work == pytest.approx((8.0 + 1.0) / 2)  # a's cheapest area is one device: 8 device-seconds
    assert chain == pytest.approx(5.0)  # a on two devices: 2 units of 2.5
    assert lower_bound(jobs, 1) == (pytest.approx(9.0), pytest.approx(8.0))  # the two-device option is out


def test_validate_catches_a_double_booked_device_and_a_broken_chain():
    jobs = [Job("a", (Option(1, 1.0),), units=2), Job("b", (Option(1, 1.0),))]
    good = Schedule([Slot(0, 0, 0, 0.0, 1.0, (0,)), Slot(0, 1, 0, 1.0, 2.0, (0,)), Slot(1, 0, 0, 0.0, 1.0, (1,))], 2, "x")
    validate(jobs, good)
    clash = Schedule([Slot(0, 0, 0, 0.0, 1.0, (0,)), Slot(0, 1, 0, 1.0, 2.0, (0,)), Slot(1, 0, 0, 0.5, 1.5, (0,))], 2, "x")
    with pytest.raises(ValueError, match="two units at once"):
        validate(jobs, clash)
    early = Schedule([Slot(0, 0, 0, 0.0, 1.0, (0,)), Slot(0, 1, 0, 0.5, 1.5, (1,)), Slot(1, 0, 0, 1.0, 2.0, (0,))], 2, "x")
    with pytest.raises(ValueError, match="before unit 0 ends"):
        validate(jobs, early)
    with pytest.raises(ValueError, match="more than 1 devices"):
        assign_devices(jobs, 1, [(0, 0, 0, 0.0, 1.0), (1, 0, 0, 0.5, 1.5)])


def test_wide_jobs_share_devices_and_one_at_a_time_runs_them_in_turn():
    jobs = [Job("a", (Option(2, 1.0),), units=3), Job("b", (Option(1, 2.0),)), Job("c", (Option(1, 2.0),))]
    s = joint(jobs, 3, hint=lrtf(jobs, 3))
    validate(jobs, s)
    # a's three units on two devices while b then c run on the third: 4 (the work bound, 10/3, is
    # out of reach with these lengths), as brute force finds
    assert s.makespan == pytest.approx(4.0, rel=1e-3)
    assert brute(jobs, 3).makespan == pytest.approx(4.0)
    turn = one_at_a_time(jobs, 3, lambda job: 0)
    validate(jobs, turn)
    assert turn.makespan == pytest.approx(3.0 + 2.0 + 2.0)
    with pytest.raises(ValueError, match="no option"):
        lrtf(jobs, 1)
