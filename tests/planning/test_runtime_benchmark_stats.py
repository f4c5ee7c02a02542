"""The runtime benchmark's "no slower" statistic (benchmarks/runtime.py, ``paired_ratio``): step
times paired round by round, pooled over whole runs, against ratios worked out by hand."""

from __future__ import annotations

import pytest

from benchmarks.runtime import _median_runs, paired_ratio, table


def test_a_constant_ratio_survives_any_drift_of_the_machine():
    # the machine slows down tenfold over the run; autopar is 0.9x DDP in every round
    base = [0.1 * (1 + i) for i in range(12)]
    rounds = [{"DDP": base, "autopar": [0.9 * b for b in base]}]
    med, lo, hi = paired_ratio(rounds, "autopar", "DDP")
    assert (med, lo, hi) == pytest.approx((0.9, 0.9, 0.9))


def test_runs_are_pooled_and_the_interval_holds_the_median():
    runs = [{"DDP": [1.0, 1.0, 1.0], "autopar": [0.9, 1.0, 1.1]},
            {"DDP": [2.0, 2.0], "autopar": [2.4, 1.6]}]
    med, lo, hi = paired_ratio(runs, "autopar", "DDP")
    assert med == pytest.approx(1.0)  # the ratios 0.9, 1.0, 1.1, 1.2, 0.8: their median
    assert 0.8 <= lo <= med <= hi <= 1.2


def _run(ddp, tp, own):
    r = {"DDP": ddp[0], "autopar DP": ddp[0], "TP": tp[0], "autopar TP": tp[0], "FSDP2": 9.0,
         "autopar": own[0], "predicted speed-up over DP": 1.0, "predicted TP / DP": 1.0, "plan": "p",
         "rounds": {"DDP": ddp, "TP": tp, "autopar": own}}
    return {"m": r}


def test_the_table_pairs_the_own_plan_with_the_fastest_pytorch_variant_over_every_run():
    repeats = [_run([2.0, 2.0], [1.0, 1.0], [0.5, 0.5]), _run([2.0, 2.0], [1.0, 3.0], [1.0, 1.5])]
    merged = _median_runs(repeats)
    assert merged["m"]["rounds"] == [r["m"]["rounds"] for r in repeats]
    row = table({2: merged}).splitlines()[-1]
    # TP is the fastest (median 1.0 in both runs); the own plan's ratios 0.5, 0.5, 1.0, 0.5: median 0.5
    assert row.rstrip(" |").endswith("vs TP") and "| 0.500 [" in row
