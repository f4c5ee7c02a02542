"""Context parallelism priced as K/V all-gathers and as a ring; the search keeps what fits.

A Llama over 131,072 tokens (4 layers, 8 query and 2 key/value heads of 128, bf16) on 16 nodes
of 8 H100, pinned to tensor 8 x context 8 x data 2, one sequence per microbatch, no pipeline,
ZeRO or recomputation, so that the all-gather and the ring plans differ in their attention
alone. By hand: a layer's keys and values of one sequence are ``2 x 131072 x 2 x 128 x 2 B`` =
128 MiB (before the grouped-query expansion), ``1/8`` of the heads per rank; the all-gather
variant saves the other ranks' ``7/8`` of them in each of the 4 layers for the backward, the
ring only its own chunk (already among the activations) and holds at most 4 chunks in flight,
once. So the plans' memory differs by ``4 x 7/8 x 16 MiB - 4 x 16/8 MiB`` = 48 MiB; with the
capacity between the two, the search returns the ring and reports the all-gather over it.

The ring's exposed time by hand (``ring_times``): with the attention's blocks longer than a hop
only the last gradients' hop home and the balancing all-to-alls are left; with no attention to
hide behind, every hop is exposed.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import autopar
from autopar.core.cluster import Cluster
from autopar.core.margin import usable_memory
from autopar.cost_models.alpha_beta import collective_time
from autopar.cost_models.ring_attention import ring_times
from autopar.planning import hierarchical as H
from autopar.planning.degrees import Pin, parse_pin
from autopar.search.dp import dp

MIB = 2 ** 20
PIN = Pin(tensor=8, pipeline=1, data=2, context=8, microbatch=1, zero=0, recompute=False)


@pytest.fixture(scope="module")
def setting():
    model, inputs = autopar.zoo.get("llama", batch=2, seq=131072, width=1024, heads=8, kv_heads=2, ffn=2048,
                                    layers=4, vocab=1024, device="meta")
    return autopar.trace(model, inputs), Cluster.preset("16x8xH100")


def _search(graph, cluster, capacity):
    return H.Search(graph, cluster, "bf16", "adam", "train", capacity, lambda t, g=None: dp(t))


def test_the_ring_fits_where_the_gathered_keys_and_values_do_not(setting):
    graph, cluster = setting
    search = _search(graph, cluster, usable_memory(cluster.memory_capacity))
    priced = {c.degrees.ring: search.price(c) for _, _, _, c in search.candidates(PIN, (0,), (False,))}
    assert set(priced) == {False, True}  # the same degrees, once gathered and once as a ring
    gather, ring = priced[False], priced[True]
    kv = 2 * 131072 * 2 * 128 * 2 / 8  # one layer's K/V of one sequence per rank of the tensor group: 16 MiB
    assert kv == 16 * MIB
    assert gather.memory - ring.memory == pytest.approx(4 * 7 / 8 * kv - 4 * kv / 8, rel=1e-9)
    capacity = (gather.memory + ring.memory) / 2
    best, _, _, _ = _search(graph, cluster, capacity).best(PIN, (0,), (False,))
    assert best is not None and best.fits and best.candidate.degrees.ring, best and best.candidate.describe()
    assert gather.memory > capacity


def test_the_rings_exposed_hops_by_hand():
    c, t, kv, bw, lat = 4, 2, 64e6, 50e9, 7e-6
    chunk = kv / (t * c)
    hop, a2a = chunk / bw + lat, collective_time("all-to-all", chunk, c, bw, lat)
    one = np.array([kv])
    hidden = ring_times(one, np.array([1.0]), c, t, bw, lat, 0.0, False)
    assert hidden[0] == pytest.approx(hop + 2 * a2a)  # blocks of 1/32 s hide every hop but the last one home
    bare = ring_times(one, np.array([0.0]), c, t, bw, lat, 0.0, False)
    assert bare[0] == pytest.approx((c - 1) * hop + (c - 1) * 2 * hop + hop + 2 * a2a)
    again = ring_times(one, np.array([0.0]), c, t, bw, lat, 0.0, True)  # the recomputed forward's ring too
    assert again[0] - bare[0] == pytest.approx((c - 1) * hop + a2a)


def test_a_pin_chooses_the_ring_or_the_gathers(setting):
    graph, cluster = setting
    search = _search(graph, cluster, usable_memory(cluster.memory_capacity))
    for ring in (False, True):
        pin = dataclasses.replace(PIN, ring=ring)
        assert {c.degrees.ring for _, _, _, c in search.candidates(pin, (0,), (False,))} == {ring}
    assert parse_pin("tensor=8,context=8,ring=1").ring is True and parse_pin("context=8,ring=0").ring is False
