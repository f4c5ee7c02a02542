"""Pipeline schedules in the hierarchical space (planning/step_price.py SCHEDULES): searched (a
case where a schedule other than 1F1B wins is chosen), and priced as their papers count them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import autopar
from autopar.core.cluster import Cluster
from autopar.cost_models.memory import optimizer_states
from autopar.cost_models.training import optimizer_step_time
from autopar.planning import hierarchical as H
from autopar.planning.step_price import dp_sync, level_link, pipeline_level, zero_factors
from autopar.search.dp import dp

# two nodes of four with a slow link: the data-parallel sync across it makes a pipeline pay
SLOW = dataclasses.replace(Cluster.preset("2x4xA100"), inter_bandwidth=1e9, name="2x4 slow")


@pytest.fixture(scope="module")
def gpt():
    model, inputs = autopar.zoo.get("gpt", layers=8, width=64, heads=4, seq=32, batch=16, vocab=256, device="meta")
    return model, inputs, autopar.trace(model, inputs)


@pytest.fixture(scope="module")
def search(gpt):
    return H.Search(gpt[2], SLOW, "bf16", "adam", "train", 80e9, lambda t, g=None: dp(t))


def test_a_schedule_with_a_smaller_bubble_is_chosen_where_it_wins(gpt, search):
    only_1f1b, *_ = search.best(None, (0, 1), (False,), schedules=("1f1b",))
    assert only_1f1b.candidate.degrees.p > 1
    model, inputs, g = gpt
    plan = autopar.plan(model, inputs, SLOW, graph=g, hierarchical=True, precision="bf16", zero=1, recompute=False,
                        baselines=False)
    assert plan.stages and plan.schedule in ("zero-bubble", "interleaved-1f1b")
    assert plan.cost < only_1f1b.cost
    assert plan.schedule in plan.report()


def _candidate(search, schedule):
    deg = next(d for d in H.level_degrees(SLOW.levels(), 64, len(search.spans))
               if d.p == 2 and d.t == 1 and d.pipeline[1] == 2)
    return H.Candidate(deg, 4, 1, False, False, schedule)


def test_zero_bubble_takes_a_third_of_the_1f1b_bubble_at_the_same_cuts(search):
    """ZB-H1 (Qi et al. 2024): bubble (p - 1)(F + B - W) = (p - 1) t / 3 with F = B = W = t / 3."""
    one, zb = (search.price(_candidate(search, s)) for s in ("1f1b", "zero-bubble"))
    assert zb.solution.stages == one.solution.stages and zb.memory == one.memory
    t, p = max(one.solution.stage_time), 2
    assert one.cost - zb.cost == pytest.approx((p - 1) * t * (1 - 1 / 3), rel=1e-9)


def test_interleaved_1f1b_is_counted_from_its_ranks_stages(search):
    """Interleaved 1F1B (Narayanan et al. 2021, 2.2), v = 2 stages per rank: each rank's time per
    microbatch is the sum of its two stages' (their units and the sends at their cuts); the step
    is (m + (p - 1) / v) of the slowest rank's, plus its syncs and optimizer step."""
    c = _candidate(search, "interleaved-1f1b")
    pr = search.price(c)
    s = search.stats(c)
    chunks = pr.solution.stages
    assert len(chunks) == 4 and chunks[0][0] == 0 and chunks[-1][1] == len(s.spans)
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
    bw, lat = level_link(SLOW, pipeline_level(c.degrees))
    cut = np.concatenate([[0.0], 2 * (lat + SLOW.call_latency + s.boundary / bw), [0.0]])
    # 3 of the 4 microbatches add their gradients (ZeRO-1: whole) into the held ones: 3 passes
    acc = 3 / 4 * 3 * s.grads / (SLOW.memory_bandwidth * 0.8)
    chunk_time = [float(np.sum(s.time[a:b] + acc[a:b])) + cut[a] + cut[b] for a, b in chunks]
    ranks = [chunk_time[0] + chunk_time[2], chunk_time[1] + chunk_time[3]]
    rank_spans = [(chunks[0], chunks[2]), (chunks[1], chunks[3])]
    sync = max(sum(float(np.sum(s.sync[a:b])) for a, b in r) for r in rank_spans)
    _, _, fo = zero_factors(1, c.degrees.d)
    dps, opts = [], []
    for r in rank_spans:
        grads = sum(float(np.sum(s.grads[a:b])) for a, b in r)
        params = sum(float(np.sum(s.params[a:b])) for a, b in r)
        numel = sum(float(np.sum(s.numel[a:b])) for a, b in r)
        dps.append(float(dp_sync(1, grads, params, 4, SLOW, c.degrees, False)))
        opts.append(optimizer_step_time(numel / fo, 2, optimizer_states("adam"), True, SLOW.memory_bandwidth))
    # ZeRO-1's reduce-scatter under the last backward (2/3 of a microbatch, backward at twice the
    # forward) and its all-gather under the next first forward (1/3): one rank-microbatch, plus rank
    # r's drain/fill idle of r / v of it; the step waits for the rest, at least the last bucket
    # (the rank's first unit)
    shown = []
    for r, spans in enumerate(rank_spans):
        u = spans[0][0]
        bucket = float(dp_sync(1, float(s.grads[u]), float(s.params[u]), 1, SLOW, c.degrees, False))
        shown.append(max(min(bucket, dps[r]), dps[r] - (1 + r / 2) * ranks[r]))
    want = (4 + (2 - 1) / 2) * max(ranks) + sync + max(shown) + max(opts)
    assert pr.cost == pytest.approx(want, rel=1e-9)
    assert pr.terms["pipeline bubble"] == pytest.approx(0.5 * max(ranks), rel=1e-9)
