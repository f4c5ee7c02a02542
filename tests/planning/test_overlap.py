"""Interleaved 1F1B with more than two stages per rank, and the data-parallel sync hidden under
compute (planning/overlap.py), counted by hand from the unit costs of a small GPT."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import autopar
from autopar.core.cluster import Cluster
from autopar.planning import hierarchical as H
from autopar.planning.step_price import dp_sync, level_link, pipeline_level, schedule_options
from autopar.search.dp import dp

# two nodes of four with a slow link: the data-parallel ring across it is longer than the compute
SLOW = dataclasses.replace(Cluster.preset("2x4xA100"), inter_bandwidth=1e9, name="2x4 slow")


@pytest.fixture(scope="module")
def search():
    model, inputs = autopar.zoo.get("gpt", layers=8, width=64, heads=4, seq=32, batch=16, vocab=256, device="meta")
    return H.Search(autopar.trace(model, inputs), SLOW, "bf16", "adam", "train", 80e9, lambda t, g=None: dp(t))


def _degrees(search, pipeline_across: bool):
    return next(d for d in H.level_degrees(SLOW.levels(), 64, len(search.spans))
                if d.p == 2 and d.t == 1 and (d.pipeline[1] == 2) == pipeline_across)


def test_four_stages_per_rank_take_a_quarter_of_the_1f1b_bubble(search):
    """Narayanan et al. 2021, 2.2: v stages per rank, bubble (p - 1) / v of the slowest rank's
    microbatch time; here p = 2, v = 4: 8 chunks of the units, rank r running chunks r, r + 2, ..."""
    assert ("interleaved-1f1b", 4) in schedule_options(("interleaved-1f1b",), 2, len(search.spans))
    c = H.Candidate(_degrees(search, True), 4, 1, False, False, "interleaved-1f1b", 4)
    pr, s = search.price(c), search.stats(c)
    chunks = pr.solution.stages
    assert len(chunks) == 8 and chunks[0][0] == 0 and chunks[-1][1] == len(s.spans)
    bw, lat = level_link(SLOW, pipeline_level(c.degrees))
    cut = np.concatenate([[0.0], 2 * (lat + SLOW.call_latency + s.boundary / bw), [0.0]])
    # 3 of the 4 microbatches add their gradients (ZeRO-1: whole) into the held ones: 3 passes
    acc = 3 / 4 * 3 * s.grads / (SLOW.memory_bandwidth * 0.8)
    chunk_time = [float(np.sum(s.time[a:b] + acc[a:b])) + cut[a] + cut[b] for a, b in chunks]
    ranks = [sum(chunk_time[0::2]), sum(chunk_time[1::2])]
    assert pr.terms["pipeline bubble"] == pytest.approx((2 - 1) / 4 * max(ranks), rel=1e-9)
    assert "4 stages per rank" in c.describe()


def test_the_step_waits_for_the_sync_that_does_not_fit_under_the_backward(search):
    """DDP buckets (no ZeRO), 1F1B over two ranks in a node, data 2 x 2 across the slow link: rank
    r's all-reduce runs under its last microbatch's backward (2/3 of its microbatch time, the
    backward at twice the forward) and the r stage-backwards it idles while the drain reaches rank
    0; the step waits for the rest, and at least for the last bucket (the rank's first unit)."""
    c = H.Candidate(_degrees(search, False), 4, 0, False, False, "1f1b")
    pr, s = search.price(c), search.stats(c)
    shown = []
    for r, (a, b) in enumerate(pr.solution.stages):
        t = pr.solution.stage_time[r]
        # the state of nodes without a batch dim (a position table's slice) is whole: never synced
        grads, params = s.grads - s.whole_grads, s.params - s.whole_params
        sync = float(dp_sync(0, float(np.sum(grads[a:b])), float(np.sum(params[a:b])), 4, SLOW, c.degrees, False))
        bucket = float(dp_sync(0, float(grads[a]), float(params[a]), 1, SLOW, c.degrees, False))
        under = (1 + r) * 2 / 3 * t
        shown.append(max(bucket, sync - under))
        assert sync > under  # the slow link: part of the sync is exposed on every rank
    assert pr.terms["data-parallel sync (exposed)"] == pytest.approx(max(shown), rel=1e-9)
    assert pr.cost == pytest.approx(pr.solution.cost + max(shown) + pr.terms["optimizer step"], rel=1e-9)


def test_a_pin_fixes_the_schedule_only_when_it_names_one():
    from autopar.planning.degrees import parse_pin

    assert H.pin_schedules(parse_pin("tensor=8,pipeline=16")) == tuple(H.SCHEDULES)
    assert H.pin_schedules(parse_pin("pipeline=16,schedule=1f1b")) == ("1f1b",)
    with pytest.raises(ValueError, match="schedule=zigzag"):
        H.pin_schedules(parse_pin("pipeline=16,schedule=zigzag"))
