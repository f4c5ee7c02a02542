"""Pipeline schedules on the flat path: GPipe, 1F1B and zero bubble priced by the formula the
hierarchical search prices them with (``search.pipeline.rounds``), the stage search choosing
among them, the plan recording the schedule it priced."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import autopar
from autopar.core.strategy import Degrees
from autopar.planning.step_price import Candidate
from autopar.search.pipeline import FLAT_SCHEDULES, StageCosts, best_cuts, search


def test_zero_bubble_is_a_third_of_1f1b_s_bubble_at_its_cuts_and_memory():
    """8 identical layers on 4 stages of 2, 8 microbatches: 1F1B takes (8 + 3) x 2 + sync, zero
    bubble (8 + 3 / 3) x 2 + sync (Qi et al. 2024, ZB-H1: the bubble (p - 1)(F + B - W) with
    F = B = W), with 1F1B's cuts and memory; the search over the flat schedules takes it."""
    c = StageCosts(1, 8, np.ones(8), np.full(8, 0.25), np.zeros(8), np.ones(8), np.zeros(7))
    one, zb = (best_cuts(c, 4, math.inf, s) for s in ("1f1b", "zero-bubble"))
    assert one.cost == pytest.approx(11 * 2.0 + 0.5) and zb.cost == pytest.approx(9 * 2.0 + 0.5)
    assert zb.stages == one.stages and zb.memory == one.memory
    best = search([c], 4, math.inf, FLAT_SCHEDULES)
    assert best.schedule == "zero-bubble" and best.cost == pytest.approx(zb.cost)
    assert search([c], 4, math.inf).schedule == "1f1b"  # without it: 1F1B, as before


def test_the_hierarchical_candidates_count_the_same_bubbles():
    """One formula: a hierarchical candidate's microbatch times per step are the flat path's."""
    deg = Degrees((1,), (4,), (1,))
    assert Candidate(deg, 8, schedule="1f1b").rounds == pytest.approx(11.0)
    assert Candidate(deg, 8, schedule="zero-bubble").rounds == pytest.approx(9.0)
    assert Candidate(deg, 8, schedule="interleaved-1f1b", stages_per_rank=4).rounds == pytest.approx(8.75)


@pytest.fixture(scope="module")
def gpt8():
    model, inputs = autopar.zoo.get("gpt", layers=8, width=1024, heads=16, seq=512, batch=32, vocab=32768,
                                    device="meta")
    return model, inputs, autopar.trace(model, inputs)


def test_a_flat_pipelined_plan_records_the_schedule_it_priced(gpt8):
    """Across a slow inter-node link a pipeline wins; its step is zero bubble's count of the
    plan's own stage times, and the report prints that count."""
    model, inputs, graph = gpt8
    slow = dataclasses.replace(autopar.Cluster.preset("2x8xH100"), inter_bandwidth=2e8, name="slow-ib")
    plan = autopar.plan(model, inputs, slow, graph=graph, baselines=False, precision="fp32", pipeline=True)
    assert plan.stages and plan.schedule == "zero-bubble"
    s, m = len(plan.stages), plan.microbatches
    step = (m + (s - 1) / 3) * max(st.cost for st in plan.stages) + max(st.sync for st in plan.stages)
    assert plan.cost == pytest.approx(step, rel=1e-9)
    from autopar.report.pipeline import step_numbers

    assert step_numbers(plan)["step"] == pytest.approx(plan.cost, rel=1e-9)
    assert "zero-bubble" in autopar.Plan.from_json(plan.to_json()).schedule
