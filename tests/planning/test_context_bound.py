"""The hierarchical search's floors hold for the plans it prices on a long-context causal
language model: a small Llama over 65,536 tokens on 2 x 8 H100, where attention is most of the
work, its tensor groups run it balanced over the query rows (half the FLOPs of the unmasked
count) and context degrees are carved out of the data degrees. A floor claims to hold for every
layout of a candidate, so it must hold for the one the search prices (``step_price.price``, a
separate computation from the floors): the compute bound, the bound under any layout, the memory
floor and its static part (parameters, gradients, optimizer state) are never above it."""

from __future__ import annotations

import numpy as np
import pytest

import autopar
from autopar.core.cluster import Cluster
from autopar.core.margin import usable_memory
from autopar.planning import hierarchical as H
from autopar.planning.lagrangian import lagrangian_bound
from autopar.planning.space_bound import (any_layout_bound, context_acts, memory_floor, state_total,
                                          transient_floor, unit_static)
from autopar.planning.units import zero_divided
from autopar.planning.step_price import data_groups, zero_factors
from autopar.search.dp import dp

ZEROS, RECS = (0, 1, 2, 3), (False, True)
STATE = ("parameters", "gradients", "optimizer state + master weights")
TRANSIENT = "transient (recomputed block, gathered ZeRO-3 parameters)"


@pytest.fixture(scope="module")
def priced():
    """The search, and per candidate of its space (compute bound, rest, static floor, candidate, price)."""
    model, inputs = autopar.zoo.get("llama", batch=4, seq=65536, width=256, heads=2, kv_heads=1, device="meta")
    cluster = Cluster.preset("2x8xH100")
    s = H.Search(autopar.trace(model, inputs), cluster, "bf16", "adam", "train",
                 usable_memory(cluster.memory_capacity), lambda t, g=None: dp(t))
    cands = s.candidates(None, ZEROS, RECS, tuple(H.SCHEDULES))
    return s, [(comp, rest, static, c, s.price(c)) for comp, rest, static, c in cands]


def _balanced(search) -> bool:
    """Whether some solved tensor group splits an attention's query rows (run balanced)."""
    for st in search._memo.values():
        for i, n in enumerate(st.graph.nodes):
            if n.op == "sdpa" and st.tables.configs[i][st.choice[i]].splits[[d.name for d in n.dims].index("l")] > 1:
                return True
    return False


def test_the_compute_bounds_are_below_every_priced_plan_with_causal_attention_balanced(priced):
    """The compute bound counts a causal attention's FLOPs at the least share any split of its rows
    runs (a half): the groups here run it balanced, and no candidate is priced below its bounds."""
    search, rows = priced
    assert _balanced(search) and search.contexts
    for comp, rest, _, c, pr in rows:
        assert comp + rest <= pr.cost * (1 + 1e-9), c.describe()
        assert any_layout_bound(search, c, comp, rest) <= pr.cost * (1 + 1e-9), c.describe()


def test_the_memory_floors_are_below_every_priced_plan_context_candidates_included(priced):
    """The static floor counts gradients and optimizer state for the parameters that take them (the
    rotary tables are buffers: they take neither), so it is at most the priced plan's state (on
    one stage: with several, the priced terms are the fullest stage's, not the average), and
    the memory floor (with context ranks: the unsplit graph's activations over t x c) at most
    the priced plan's peak."""
    search, rows = priced
    assert any(c.degrees.c > 1 for _, _, _, c, _ in rows)
    for _, _, static, c, pr in rows:
        if c.degrees.p == 1:
            assert static <= sum(pr.memory_terms[k] for k in STATE) * (1 + 1e-9) + 1e-6, c.describe()
        assert memory_floor(search, c, static) <= pr.memory * (1 + 1e-9) + 1e-6, c.describe()


def test_the_per_unit_floors_are_below_what_each_priced_unit_holds(priced):
    """Per unit, as ``price`` counts it on the plan it prices: a context rank's activation floor
    (its group's least per node over k, no sequence parallelism, the other ranks' K/V where
    gathered) at most the unit's activations; the state floor (ZeRO's divisors but for the state
    of nodes without a batch dim, kept whole) at most the unit's state; their sum over the units
    at most the stages' state summed; the transient floor (ZeRO-3's whole units, the recomputed
    unit's extra, with context ranks too) at most the priced transient."""
    search, rows = priced
    whole_kept = 0
    for _, _, static, c, pr in rows:
        s = search.stats(c)
        if c.degrees.c > 1:
            assert np.all(context_acts(search, c) <= s.acts * (1 + 1e-9) + 1e-6), c.describe()
        g, _, _, _ = data_groups(c.degrees, c.zero_inner)
        held = sum(zero_divided(s, *zero_factors(c.zero, g))[:3])
        assert np.all(unit_static(search, c) <= held * (1 + 1e-9) + 1e-6), c.describe()
        last = s.shared * float(np.sum(held)) / float(np.sum(s.params + s.grads + s.optimizer)) if c.degrees.p == 1 else 0
        assert state_total(search, c, static) <= (float(np.sum(held)) - last) * (1 + 1e-9) + 1e-6, c.describe()
        assert transient_floor(search, c) <= pr.memory_terms[TRANSIENT] * (1 + 1e-9) + 1e-6, c.describe()
        whole_kept += c.zero == 3 and float(np.sum(s.whole_params)) > 0
    assert whole_kept  # the rotary tables' state is kept whole under ZeRO-3: the case the floor counts


def test_the_context_floors_see_what_the_ranks_hold(priced):
    """With context ranks, the activations any layout saves are at least the unsplit graph's over
    t x k (no config splits a node's saved tensors over more than the group), and the memory floor
    comes within a third of every priced plan's peak; ZeRO-3's context ranks hold some whole
    units (a transient floor above zero)."""
    search, rows = priced
    for _, _, static, c, pr in rows:
        deg = c.degrees
        if deg.c == 1:
            continue
        whole = float(np.sum(search.whole_stats(c.recompute).acts)) / (deg.d * c.microbatches * deg.t * deg.c)
        assert float(np.sum(context_acts(search, c))) >= whole * (1 - 1e-9), c.describe()
        assert memory_floor(search, c, static) >= pr.memory / 3, c.describe()
        if c.zero == 3:
            assert transient_floor(search, c) > 0, c.describe()


def test_the_lagrangian_bound_of_context_candidates_is_below_their_fitting_plans(priced):
    """At a capacity a third of the context candidates' priced plans fit (every third candidate,
    a fresh search), each fitting plan's price is at least the candidate's Lagrangian bound,
    whose memory floor counts the context ranks' activations, ZeRO-3's whole units and the
    state kept whole."""
    search, rows = priced
    ctx = [r for r in rows if r[3].degrees.c > 1][::3]
    fresh = H.Search(search.graph, search.cluster, "bf16", "adam", "train",
                     sorted(pr.memory for *_, pr in ctx)[len(ctx) // 3], lambda t, g=None: dp(t))
    fitting = 0
    for comp, rest, static, c, _ in ctx:
        pr = fresh.price(c)
        if pr.fits:
            fitting += 1
            assert lagrangian_bound(fresh, c, comp, rest, static) <= pr.cost * (1 + 1e-9), c.describe()
    assert fitting >= len(ctx) // 4
