"""The hierarchical search chooses a context degree itself: for a causal language model each
power of two that leaves the sequence in whole balanced chunks is carved out of the data
degrees. Checked against brute force over the pins: the search's plan is no slower than the
best plan of every pinned context degree (each priced by the same search restricted to it),
and where context parallelism pays it picks a context degree."""

from __future__ import annotations

import pytest

import autopar
from autopar.core.cluster import Cluster
from autopar.core.margin import usable_memory
from autopar.planning import hierarchical as H
from autopar.planning.context import context_options
from autopar.planning.degrees import Pin
from autopar.search.dp import dp

ZEROS, RECS = (0, 1, 2, 3), (False, True)


def _search(graph, cluster, precision="bf16"):
    return H.Search(graph, cluster, precision, "adam", "train", usable_memory(cluster.memory_capacity),
                    lambda t, g=None: dp(t))


@pytest.fixture(scope="module")
def long_llama():
    """A small Llama over 16,384 tokens, 4 sequences on 128 H100: attention dominates, and data
    parallelism alone has 4 sequences for 128 devices."""
    model, inputs = autopar.zoo.get("llama", batch=4, seq=16384, width=256, heads=8, kv_heads=2, ffn=512,
                                    layers=4, vocab=1024, device="meta")
    return model, inputs, autopar.trace(model, inputs)


def test_context_degrees_are_the_powers_of_two_leaving_whole_chunks_of_at_least_1024_tokens(long_llama):
    assert context_options(long_llama[2]) == (2, 4, 8, 16)
    mlp, x = autopar.zoo.get("mlp", batch=8, device="meta")
    assert context_options(autopar.trace(mlp, x)) == ()  # no attention: no context degree


@pytest.mark.slow
def test_the_search_is_no_slower_than_any_pinned_context_degree_and_picks_one_where_it_pays(long_llama):
    model, inputs, g = long_llama
    cluster = Cluster.preset("16x8xH100")
    plan = autopar.plan(model, inputs, cluster, graph=g, precision="bf16", hierarchical=True)
    s = _search(g, cluster)
    pinned = {}
    for c in (1, 2, 4, 8, 16):
        best, _, _, closed = s.best(Pin(context=c), ZEROS, RECS, schedules=tuple(H.SCHEDULES))
        assert best is not None and closed
        pinned[c] = best.cost
    assert plan.cost <= min(pinned.values()) * (1 + 1e-9), (plan.cost, pinned)
    assert plan.strategy.degrees.c > 1 and min(pinned, key=pinned.get) > 1
    assert plan.cost < pinned[1] / 2  # context parallelism pays here: more than twice faster


@pytest.mark.slow
def test_the_405b_long_context_search_is_no_slower_than_the_papers_pinned_plan():
    """Llama 3 405B at sequence 131,072 on 16,384 H100: the paper's tensor 8 x context 16 x
    pipeline 16 x data 8, priced pinned, against the search's own plan (not seeded with it)."""
    rec = autopar.zoo.published_run("llama3_405b_long")
    cluster = Cluster.preset(rec.cluster)
    s = _search(autopar.trace(*autopar.zoo.get("llama3_405b_long")), cluster, rec.precision)
    pin = Pin(tensor=rec.tensor, pipeline=rec.pipeline, data=rec.data, context=rec.context,
              zero=rec.zero, microbatch=rec.microbatch_size, schedule=rec.schedule)
    paper, _, _, _ = s.best(pin, (rec.zero,), RECS, schedules=H.pin_schedules(pin))
    best, _, _, closed = s.best(None, ZEROS, RECS, schedules=tuple(H.SCHEDULES))
    assert paper is not None and paper.fits and best is not None and best.fits and closed
    assert best.cost <= paper.cost * (1 + 1e-9) and best.candidate.degrees.c > 1
