"""``plan.search`` says what is proven: "proven optimal" only from an exact path.

A pipelined plan cuts stages exactly but keeps each stage's splits from the whole-graph optimum,
so it is a heuristic; a time-limited ILP that stops early has a proven bound, not an optimum; a
baseline is a fixed strategy. The report and the plan file must say so, and a plan file read back
must say the same.
"""

from __future__ import annotations

import dataclasses

import pytest

import autopar
from autopar.planning.plan import SearchInfo


def test_a_pipelined_plan_is_reported_as_a_heuristic(piped_gpt, tmp_path):
    plan = piped_gpt.plan
    assert plan.stages
    assert plan.search.status == "heuristic" and not plan.search.proven_optimal
    text = plan.report()
    assert "proven optimal" not in text.splitlines()[1]
    assert "heuristic" in text.splitlines()[1] and "not re-optimized per stage" in text
    plan.save(tmp_path / "p.json")
    back = autopar.Plan.load(tmp_path / "p.json")
    assert back.search.status == "heuristic" and back.search.detail == plan.search.detail


def test_a_single_stage_plan_beside_pipeline_options_says_where_its_proof_holds(piped_gpt):
    model, inputs, slow = piped_gpt.model, piped_gpt.inputs, piped_gpt.cluster
    fast = dataclasses.replace(slow, inter_bandwidth=1e12, name="fast-ib")
    plan = autopar.plan(model, inputs, fast, pipeline=True, baselines=False)
    assert not plan.stages and plan.search.proven_optimal
    assert "among single-stage plans" in plan.report().splitlines()[1]


def test_an_exact_plan_is_proven_optimal_and_baselines_are_fixed():
    model, inputs = autopar.zoo.get("mlp", device="meta")
    plan = autopar.plan(model, inputs, autopar.Cluster(devices=4), pipeline=False)
    assert plan.search.status == "optimal" and plan.search.gap == 0.0
    assert plan.report().splitlines()[1].endswith("proven optimal under the cost model")
    dp = plan.baselines["data_parallel"].search
    assert dp.status == "fixed" and not dp.proven_optimal


def test_an_exact_search_that_stopped_early_reports_its_bound():
    info = SearchInfo.exact("ilp", 1.0, 0.02)
    assert info.status == "bound" and "2.000%" in info.describe() and "not proven" in info.describe()
    assert SearchInfo.exact("ilp", 1.0, float("inf")).status == "heuristic"
    # a gap too small for three decimals is still a gap: never "at most 0.000%"
    tiny = SearchInfo.exact("hierarchical", 1.0, 2e-7).describe()
    assert "0.000%" not in tiny and "less than 0.001% above the optimum" in tiny and "not proven" in tiny
    # an "optimal" claim with a gap is corrected, never kept
    assert SearchInfo("dp", 1.0, 0.1, status="optimal").status == "bound"
    with pytest.raises(ValueError, match="search status"):
        SearchInfo("dp", 1.0, status="best")


def test_old_plan_files_without_a_status_read_back_as_what_they_claimed():
    from autopar.planning.plan import _search_from_json

    assert _search_from_json({"name": "dp", "seconds": 1.0, "gap": 0.0}).status == "optimal"
    assert _search_from_json({"name": "ilp", "seconds": 1.0, "gap": 0.5}).status == "bound"
    assert _search_from_json({"name": "dp + pipeline", "seconds": 1.0, "gap": 0.0}).status == "heuristic"
    assert _search_from_json({"name": "fixed", "seconds": 0.0}).status == "fixed"
