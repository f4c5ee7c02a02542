"""Strategy-quality regression: re-plan the fast cases of benchmarks/cases.py against benchmarks/baseline.json.

A predicted cost that moved by more than 0.1% either way (a plan that looks cheaper is as suspect as
one that looks dearer), a cost that is not what the plan's chosen configs price at in its tables, a
plan that no longer fits, or a baseline case gone from the suite fails here, naming the case. Moving
the baseline on purpose is ``python -m benchmarks.run --update --reason "..."``. PaSE's cases are
also held to the optima PaSE's own tool printed (independent of autopar and of the baseline file).
The last tests prove the check itself fails on each kind of change (the same function, pointed at
a copy of the baseline or of the outcomes).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # pytest runs with --import-mode=importlib; benchmarks/ lives at the repo root
    sys.path.insert(0, str(ROOT))

from benchmarks import run as bench  # noqa: E402
from benchmarks.cases import SUITE  # noqa: E402

FAST = [c for c in SUITE if c.fast]


@pytest.fixture(scope="module")
def outcomes():
    """Each fast case planned once (tracing is shared between cases of the same model)."""
    traced: dict = {}
    return {c.name: bench.run_case(c, repeat=1, traced=traced) for c in FAST}


@pytest.fixture(scope="module")
def baseline():
    if not bench.BASELINE.exists():
        pytest.fail("benchmarks/baseline.json is missing: run python -m benchmarks.run --update --reason '...'")
    return bench.load_baseline()


def test_fast_cases_are_in_the_baseline(baseline):
    missing = [c.name for c in FAST if c.name not in baseline["cases"]]
    assert not missing, f"fast cases without a baseline entry: {missing}; run benchmarks.run --update"


def test_no_regression(outcomes):
    problems = bench.check(bench.BASELINE, outcomes=outcomes)
    assert not problems, "\n".join(problems)


def _worsened(baseline: dict, tmp_path: Path, name: str, **change) -> Path:
    doc = copy.deepcopy(baseline)
    doc["cases"][name].update(change)
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(doc))
    return path


def _planned(outcomes):
    return next(n for n, o in outcomes.items() if not o.error)


def test_check_fails_on_a_better_stored_cost(outcomes, baseline, tmp_path):
    """Done-when: a baseline cost lowered by 5% makes the very check above fail, naming the case."""
    name = _planned(outcomes)
    path = _worsened(baseline, tmp_path, name, cost=baseline["cases"][name]["cost"] * 0.95)
    problems = bench.check(path, outcomes=outcomes)
    assert problems and all(p.startswith(f"{name}:") for p in problems), problems
    assert "worse than baseline" in problems[0]


def test_check_fails_on_a_worse_stored_cost(outcomes, baseline, tmp_path):
    """A plan that now looks 5% cheaper than the baseline (a cost model or search that under-prices)
    fails as a regression does, naming the case."""
    name = _planned(outcomes)
    path = _worsened(baseline, tmp_path, name, cost=baseline["cases"][name]["cost"] * 1.05)
    problems = bench.check(path, outcomes=outcomes)
    assert problems and all(p.startswith(f"{name}:") for p in problems), problems
    assert "better than baseline" in problems[0]


@pytest.mark.parametrize("factor", [1 - bench.TOLERANCE / 2, 1 + bench.TOLERANCE / 2])
def test_check_tolerates_drift_under_tolerance(outcomes, baseline, tmp_path, factor):
    name = _planned(outcomes)
    path = _worsened(baseline, tmp_path, name, cost=baseline["cases"][name]["cost"] * factor)
    assert bench.check(path, outcomes=outcomes) == []


def test_every_plan_costs_what_its_configs_price_at(outcomes):
    """The re-pricing ran: every single-stage fast case kept its tables and was summed afresh."""
    priced = [n for n, o in outcomes.items() if o.repriced is not None]
    assert len(priced) >= len(outcomes) - 2, {n: o.repriced for n, o in outcomes.items()}


def test_check_fails_when_a_plan_reports_less_than_its_configs_cost(outcomes, baseline):
    """A search that reports a lower total than its own assignment sums to fails, even when the
    baseline was moved to match it."""
    name = next(n for n, o in outcomes.items() if o.repriced is not None)
    cheaper = bench.Outcome(**{**vars(outcomes[name]), "cost": outcomes[name].cost * 0.97})
    doc = copy.deepcopy(baseline)
    doc["cases"][name]["cost"] = cheaper.cost
    problems = bench.compare(doc, {name: cheaper})
    assert problems and all(p.startswith(f"{name}:") for p in problems), problems
    assert "price at" in problems[0]


# PaSE's tool, docs/pase.md section 8 (r = 5000): the optimum it printed per device count.
PASE_OPTIMUM = {"alexnet": {4: 148215719552, 16: 70320712672},
                "rnnlm": {4: 6866837733376, 16: 2476066881536, 64: 935818633216}}


def test_pase_cases_cost_what_pase_printed(outcomes):
    cases = {c.name: c for c in FAST if c.cost_model == "pase"}
    checked = 0
    for name, case in cases.items():
        want = PASE_OPTIMUM.get(case.model, {}).get(case.devices)
        if want is not None:
            assert outcomes[name].cost == pytest.approx(want, rel=1e-9), name
            checked += 1
    assert checked == 5


def test_check_fails_when_a_fitting_plan_stops_fitting(outcomes, baseline, tmp_path):
    name = _planned(outcomes)
    broken = dict(outcomes, **{name: bench.Outcome(**{**vars(outcomes[name]), "fits": False})})
    problems = bench.check(bench.BASELINE, outcomes=broken)
    assert any(p.startswith(f"{name}:") and "no longer" in p for p in problems), problems


def test_check_fails_when_a_case_leaves_the_suite(outcomes, baseline, tmp_path):
    doc = copy.deepcopy(baseline)
    doc["cases"]["gone-case-p4"] = {"cost": 1.0, "memory_per_device": 0.0, "fits": True}
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(doc))
    problems = bench.check(path, outcomes=outcomes)
    assert any(p.startswith("gone-case-p4:") and "no longer in the suite" in p for p in problems), problems
