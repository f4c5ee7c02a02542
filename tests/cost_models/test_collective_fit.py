"""The collective fit times each collective from its call to its return inside a step-like burst:
whatever the compute between collectives does (slower, faster, noisy: other processes on the
host), the time read is the collective's own."""

import random

import pytest

from autopar.cost_models.collective_fit import in_step_time


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("seed", range(3))
def test_a_collective_is_timed_alone_whatever_the_work_around_it_takes(seed):
    rng, clock = random.Random(seed), Clock()
    calls = []

    def seg():  # the compute between collectives: 1-9 ms, noisy as on a loaded host
        clock.now += rng.uniform(1e-3, 9e-3)

    def op():  # the collective: 0.7 ms
        clock.now += 7e-4
        calls.append(1)

    got = in_step_time(op, seg, burst=8, repeats=5, barrier=lambda: None, sync=lambda: None, clock=clock)
    assert got == pytest.approx(7e-4, rel=1e-9)
    assert len(calls) == 8 * (5 + 1)  # a warm-up burst, then the timed ones


def test_each_burst_starts_together_and_the_median_of_bursts_is_taken():
    clock, barriers, k = Clock(), [], iter(range(100))
    slow = {2: 5e-3}  # one burst's collectives wait on a peer that was descheduled

    def op():
        clock.now += slow.get(len(barriers), 1e-3)

    got = in_step_time(op, lambda: next(k), burst=4, repeats=5, barrier=lambda: barriers.append(1),
                       sync=lambda: None, clock=clock)
    assert len(barriers) == 6 and got == pytest.approx(1e-3)
