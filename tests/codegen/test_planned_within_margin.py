"""The planner plans against what compile allows: a device's capacity less 10% and 512 MiB.

A plan the planner calls fitting is one ``autopar.compile`` accepts. The cases use a capacity
where the fastest plan ignoring the margin needs more than the capacity less the margin but no
more than the capacity itself: the planner must pick a plan within the usable memory (and compile
it on a 2-rank group), or say in one line that none fits. The usable figure is computed here from
the stated rule (10% of capacity + 512 MiB), not read back from ``core/margin.py``.
"""

from __future__ import annotations

import pytest

import autopar
from tests.helpers.dist_utils import run_threaded

MIB = 2**20


def _usable(capacity: float) -> float:
    return 0.9 * capacity - 512 * MIB


def _capacity_for(usable: float) -> float:
    return (usable + 512 * MIB) / 0.9


@pytest.fixture(scope="module")
def gpt():
    model, inputs = autopar.zoo.get("gpt", layers=1, batch=4, seq=8, width=16, heads=2, vocab=32)
    cluster = autopar.Cluster.preset("cpu", devices=2)
    fastest = autopar.plan(model, inputs, cluster, memory_capacity=1e12, baselines=False)
    return model, inputs, cluster, fastest


def _compiles(rank, world, model, inputs, plan):
    autopar.compile(model, inputs, plan=plan)  # raises InfeasibleError over the margin
    return True


def test_the_planner_keeps_within_the_margin_and_compile_accepts_its_plan(gpt):
    model, inputs, cluster, fastest = gpt
    capacity = _capacity_for(0.97 * fastest.memory_per_device)  # the fastest plan fits it, not its usable part
    assert _usable(capacity) < fastest.memory_per_device <= capacity
    plan = autopar.plan(model, inputs, cluster, memory_capacity=capacity)
    assert plan.memory_per_device <= _usable(capacity), (plan.memory_per_device, _usable(capacity))
    assert plan.cost >= fastest.cost  # a slower plan: the fastest one was ruled out by the margin
    assert run_threaded(_compiles, 2, model, inputs, plan) == [True, True]
    # the report states the margin and does not say compile refuses the plan
    line = next(x for x in plan.report().splitlines() if "memory per device" in x)
    assert "(margin " in line and "refuses" not in line
    # the baselines' "fits" follows the same limit: none over the usable memory is called fitting
    for name, b in plan.baselines.items():
        over = b.memory_per_device > _usable(capacity)
        assert ("does not fit" in plan.report().split(f"vs {name.replace('_', ' ')}:")[1].splitlines()[0]) == over


def test_a_plan_at_the_limit_up_to_rounding_is_not_refused():
    from autopar.core.margin import over_margin

    capacity = 4 * 2**30
    assert over_margin(_usable(capacity) * (1 + 1e-13), capacity) is None  # the search's float slack
    assert over_margin(_usable(capacity) * (1 + 1e-6), capacity) is not None


def test_no_plan_within_the_margin_is_one_line_infeasible(gpt):
    model, inputs, cluster, fastest = gpt
    capacity = fastest.memory_per_device + 512 * MIB  # holds the plan, but not with the margin
    assert _usable(capacity) < 0
    with pytest.raises(autopar.InfeasibleError) as info:
        autopar.plan(model, inputs, cluster, memory_capacity=capacity, baselines=False)
    message = str(info.value)
    assert len(message.splitlines()) == 1 and "margin" in message, message


def test_the_hierarchical_search_keeps_within_the_margin(gpt):
    model, inputs, cluster, _ = gpt
    free = autopar.plan(model, inputs, cluster, memory_capacity=1e12, hierarchical=True, baselines=False)
    capacity = _capacity_for(0.97 * free.memory_per_device)
    assert _usable(capacity) < free.memory_per_device <= capacity
    try:
        plan = autopar.plan(model, inputs, cluster, memory_capacity=capacity, hierarchical=True, baselines=False)
    except autopar.InfeasibleError as e:
        assert len(str(e).splitlines()) == 1 and "margin" in str(e)
    else:
        assert plan.memory_per_device <= _usable(capacity)
