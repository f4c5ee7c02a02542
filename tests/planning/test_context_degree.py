"""A context-parallel degree in the hierarchical search's Degrees and Pin, and its price: each
sequence split over c ranks, keys and values gathered for attention, gradients reduced over
context x data. Checked against counts made here from the model's shape and the links."""

from __future__ import annotations

import numpy as np
import pytest

import autopar
from autopar.core.cluster import Cluster
from autopar.core.margin import usable_memory
from autopar.core.strategy import Degrees
from autopar.planning import hierarchical as H
from autopar.planning.context import kv_bytes
from autopar.planning.degrees import Pin, parse_pin, with_context
from autopar.planning.step_price import Candidate, data_groups
from autopar.search.dp import dp

B, S, W, HEADS, KV, LAYERS = 16, 64, 128, 4, 2, 2


@pytest.fixture(scope="module")
def llama():
    model, inputs = autopar.zoo.get("llama", batch=B, seq=S, width=W, heads=HEADS, kv_heads=KV, ffn=256,
                                    layers=LAYERS, vocab=256, device="meta")
    return model, inputs, autopar.trace(model, inputs)


def test_pin_parses_context_and_carves_it_from_the_data_degrees_innermost_first():
    assert parse_pin("tensor=8,context=16,pipeline=16,data=8").context == 16
    deg = Degrees((8, 1), (1, 16), (1, 128))
    ctx = with_context(deg, 16)
    assert (ctx.data, ctx.context, ctx.c, ctx.d, ctx.devices) == ((1, 8), (1, 16), 16, 8, deg.devices)
    mixed = with_context(Degrees((2, 1), (1, 1), (4, 4)), 8)  # 4 in the node, then 2 across nodes
    assert (mixed.data, mixed.context) == ((1, 2), (4, 2))
    assert with_context(Degrees((8,), (1,), (1,)), 2) is None
    assert Pin(tensor=8, context=16).admits(ctx) and not Pin(tensor=8).admits(ctx)
    assert "context 16 (across nodes)" in ctx.describe()
    assert Degrees.from_json(ctx.to_json()) == ctx
    # gradients are reduced over context x data: 128 ranks, as without the context split
    assert data_groups(ctx, False)[0] == 128


def test_kv_bytes_are_the_keys_and_values_before_the_grouped_query_expansion(llama):
    _, _, g = llama
    s = H.Search(g, Cluster.preset("2x8xA100"), "fp32", "adam", "train", 1e12, lambda t, g=None: dp(t))
    kv = kv_bytes(s.graph, s.spans)
    per_block = 2 * B * KV * S * (W // HEADS) * 4  # K and V, kv heads only, fp32
    blocks = [u for u, (a, _) in enumerate(s.spans) if any(b.nodes[0] == a for b in s.blocks)]
    assert len(blocks) == LAYERS
    assert np.allclose(kv[blocks], per_block) and kv.sum() == LAYERS * per_block


def test_a_context_rank_does_1_over_c_of_the_work_plus_the_gathers_counted_by_hand(llama):
    _, _, g = llama
    cluster = Cluster.preset("4x8xA100")
    s = H.Search(g, cluster, "bf16", "adam", "train", usable_memory(cluster.memory_capacity), lambda t, g=None: dp(t))
    base_deg = Degrees((2, 1), (1, 1), (4, 4))  # tensor 2 x data 16, one sequence per microbatch
    ctx_deg = with_context(Degrees((2, 1), (1, 1), (4, 4)), 4)  # tensor 2 x context 4 (in-node) x data 4
    base = s.stats(Candidate(base_deg, 1))
    ctx = s.stats(Candidate(ctx_deg, 4))  # 4 microbatches of one sequence: the same sequences per rank group
    assert np.allclose(ctx.compute, base.compute / 4)
    # per block and microbatch: all-gather K, V (bf16, the tensor group's half of the kv heads) over 4
    # in-node ranks before attention, reduce-scatter their gradients after it; ring formulas by hand
    nbytes = 2 * 1 * KV * S * (W // HEADS) * 2 / 2
    bw, lat, call = cluster.intra_bandwidth, cluster.intra_latency, cluster.call_latency
    one = 3 / 4 * nbytes / bw + 3 * lat + call
    extra = ctx.comm - base.comm / 4
    blocks = [u for u, (a, _) in enumerate(s.spans) if any(b.nodes[0] == a for b in s.blocks)]
    assert np.allclose(extra[blocks], 2 * one, rtol=1e-9)
    others = [u for u in range(len(s.spans)) if u not in blocks]
    assert np.allclose(extra[others], 0.0)


def test_a_context_pin_is_priced_and_named_in_the_plan(llama):
    model, inputs, g = llama
    cluster = Cluster.preset("4x8xA100")
    plan = autopar.plan(model, inputs, cluster, graph=g, precision="bf16", zero=0, recompute=False,
                        pin="tensor=2,pipeline=1,context=4,data=4", hierarchical=True)
    pinned = plan.baselines["published"]
    d = pinned.strategy.degrees
    assert (d.t, d.c, d.p, d.d) == (2, 4, 1, 4)
    assert any("context parallelism over 4 ranks" in n for n in pinned.strategy.notes)
    assert pinned.cost > 0 and np.prod(pinned.mesh.shape) == 32
