"""The hierarchical search weighs a pipeline schedule only with the options codegen runs it with
as priced: a stage under ZeRO-3 or pointwise recomputation runs each microbatch's whole backward
in zero bubble's input half (its weight half idles: 1F1B's bubble, not the third zero bubble is
priced at), and interleaved 1F1B is not generated with ZeRO-3. So those plans are 1F1B, while
ZeRO-2 without pointwise recomputation keeps zero bubble where the microbatches allow it."""

from __future__ import annotations

import pytest

import autopar
from autopar.core.schedules import SCHEDULES

SIZES = dict(batch=8, seq=8, width=16, heads=2, layers=4, vocab=32)
PIN = "tensor=1,pipeline=2,data=2,microbatch=1"  # 4 microbatches a step over 2 stages


def _schedule(**options) -> str:
    model, inputs = autopar.zoo.get("gpt", **SIZES)
    cluster = autopar.Cluster.preset("cpu", devices=4)
    plan = autopar.plan(model, inputs, cluster, hierarchical=True, pin=PIN, **options).baselines["published"]
    assert len(plan.stages) >= 2 and plan.microbatches % 2 == 0, (plan.stages, plan.microbatches)
    return plan.schedule


def test_zero_bubble_is_cheaper_where_it_runs_as_priced():
    """The control: ZeRO-2 without pointwise recomputation is planned zero bubble (its bubble a third)."""
    assert SCHEDULES["zero-bubble"][1] < SCHEDULES["1f1b"][1]
    assert _schedule(zero=2, recompute=False) == "zero-bubble"


@pytest.mark.parametrize("options", [dict(zero=3, recompute=False), dict(zero=2, recompute="pointwise")],
                         ids=["zero3", "pointwise"])
def test_whole_backward_stages_are_planned_1f1b(options):
    assert _schedule(**options) == "1f1b"


def test_interleaved_zero3_is_not_weighed():
    """Pinned to interleaved 1F1B with ZeRO-3 (which codegen refuses), the search finds no plan and
    says why in one line."""
    model, inputs = autopar.zoo.get("gpt", **SIZES)
    cluster = autopar.Cluster.preset("cpu", devices=4)
    with pytest.raises(ValueError) as e:
        autopar.plan(model, inputs, cluster, hierarchical=True, pin=PIN + ",schedule=interleaved-1f1b", zero=3,
                     recompute=False)
    assert "\n" not in str(e.value) and "interleaved 1F1B runs without ZeRO-3" in str(e.value)
