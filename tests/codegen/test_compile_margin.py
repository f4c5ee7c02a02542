"""The memory safety margin: a plan may use a device's capacity less 10% and 512 MiB.

``autopar.compile`` refuses, on every rank and in one line with the numbers, a plan that fits its
stated capacity but not the capacity less the margin (the planner keeps within the margin, so such
a plan is one stated for a smaller device than it was made for); ``autopar run`` refuses
it before starting any process; the report states the margin. The expected figures are computed
here from the stated rule (10% of capacity + 512 MiB), not read back from ``core/margin.py``.
"""

from __future__ import annotations

import pytest

import autopar
from autopar.core.margin import over_margin, usable_memory
from autopar.report.format import fmt_bytes
from tests.helpers.cli_utils import cli, one_line_error
from tests.helpers.dist_utils import run_threaded

GIB, MIB = 2**30, 2**20
MLP = "zoo:mlp:batch=16,hidden=32"


def _gpt():
    return autopar.zoo.get("gpt", layers=1, batch=4, seq=8, width=16, heads=2, vocab=32)


def _tight_plan(model, inputs):
    """A plan for 2 devices stated for a capacity of its prediction + 512 MiB: it fits that capacity
    but not that less the margin. The planner itself keeps within the margin, so the plan is made
    for the roomy default and then stated for the smaller device, as a plan file moved to one would be."""
    plan = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=2), baselines=False)
    capacity = plan.memory_per_device + 512 * MIB
    plan.cluster["memory_capacity"] = capacity
    assert plan.memory_per_device <= capacity
    return plan, capacity


def test_the_margin_is_ten_percent_and_512_mib():
    assert usable_memory(10 * GIB) == pytest.approx(10 * GIB - GIB - 512 * MIB)
    assert over_margin(8.4 * GIB, 10 * GIB) is None
    assert "8.6 GiB" in over_margin(8.6 * GIB, 10 * GIB)
    # a GPU with less free than its capacity: the margin of what is free
    assert usable_memory(80 * GIB, free=5 * GIB) == pytest.approx(5 * GIB - 0.5 * GIB - 512 * MIB)
    assert over_margin(0, 10 * GIB) is None and over_margin(GIB, None) is None


def _expect_refusal(rank, world, model, inputs, plan):
    with pytest.raises(autopar.InfeasibleError) as info:
        autopar.compile(model, inputs, plan=plan)
    return str(info.value)


def test_compile_refuses_a_plan_over_the_capacity_less_the_margin_on_every_rank():
    model, inputs = _gpt()
    plan, capacity = _tight_plan(model, inputs)
    messages = run_threaded(_expect_refusal, 2, model, inputs, plan)
    margin = 0.10 * capacity + 512 * MIB
    for m in messages:
        assert len(m.splitlines()) == 1
        assert "margin" in m and f"{margin / MIB:.3g} MiB" in m and f"{capacity / MIB:.3g} MiB" in m, m


def test_the_report_states_the_margin():
    model, inputs = _gpt()
    plan, capacity = _tight_plan(model, inputs)
    line = next(x for x in plan.report().splitlines() if "memory per device" in x)
    assert f"of {fmt_bytes(capacity)} (margin {fmt_bytes(0.10 * capacity + 512 * MIB)})" in line
    assert "compile refuses it" in line
    roomy = autopar.plan(model, inputs, autopar.Cluster(devices=2), baselines=False)  # 80 GB devices
    assert f"(margin {fmt_bytes(8e9 + 512 * MIB)})" in roomy.report() and "refuses" not in roomy.report()


def test_run_refuses_it_before_starting_any_process(tmp_path):
    model, inputs = autopar.zoo.get("mlp", batch=16, hidden=32)
    plan, _ = _tight_plan(model, inputs)
    plan.save(tmp_path / "tight.json")
    r = cli("run", MLP, "--nproc", "2", "--plan", str(tmp_path / "tight.json"))
    assert one_line_error(r) and "margin" in r.stderr, r.stderr
