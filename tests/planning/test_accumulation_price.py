"""Gradient accumulation priced on the flat path's pipeline stages (planning/stages.py): every
microbatch after the first adds its gradients into the held ones, three passes over the gradient
bytes at the memory's bandwidth x 0.8, counted here from torch's own parameter count."""

from __future__ import annotations

import math

import numpy as np

import autopar
from autopar.cost_models.analytic import AnalyticModel
from autopar.planning import stages
from autopar.search.dp import dp


def test_a_flat_pipeline_stage_adds_each_later_microbatch_s_gradients_into_the_held_ones():
    """Two stages of one device each (nothing to shard: every gradient is whole, fp32), 4
    microbatches: the stages' time per microbatch is their nodes' and edges' less the
    once-per-step sync, plus 3/4 x 3 passes over all the gradient bytes."""
    model, inputs = autopar.zoo.get("gpt", layers=2, width=64, heads=4, seq=32, batch=8, vocab=256, device="meta")
    numel = sum(p.numel() for p in model.parameters())
    cluster = autopar.Cluster.preset("2x1xA100")
    g = autopar.trace(model, inputs)
    option = stages.price_option(g, cluster, 2, 1, 4, "train", "adam", lambda t, gg=None: dp(t),
                                 AnalyticModel(optimizer="adam"))
    t, choice = option.tables, option.choice
    composed = (sum(float(t.node_cost[i][choice[i]]) for i in range(len(choice)))
                + sum(float(m[choice[u], choice[v]]) for (u, v), m in t.edge_cost.items())
                - float(np.sum(option.costs.sync)))
    hand = (4 - 1) / 4 * 3 * 4 * numel / (cluster.memory_bandwidth * 0.8)
    assert math.isclose(float(np.sum(option.costs.time)) - composed, hand, rel_tol=1e-9)


def test_the_any_layout_bound_s_accumulation_floor_is_the_price_s_term_where_nothing_is_split():
    """Tensor 1 (every gradient whole on its device), 2 stages, 4 microbatches: the floor the
    certified bounds add (``space_bound.accumulation_floor``) is the hand count over torch's
    parameters, bf16, and never above what ``price`` charges per unit; with tensor 2 the floor
    stays below the chosen layout's term."""
    from autopar.core.margin import usable_memory
    from autopar.core.strategy import Degrees
    from autopar.planning import hierarchical as H
    from autopar.planning.space_bound import accumulation_floor
    from autopar.planning.step_price import accumulated

    model, inputs = autopar.zoo.get("gpt", layers=4, width=64, heads=4, seq=32, batch=16, vocab=256, device="meta")
    numel = sum(p.numel() for p in model.parameters())
    cluster = autopar.Cluster.preset("2x2xA100")
    s = H.Search(autopar.trace(model, inputs), cluster, "bf16", "adam", "train", usable_memory(cluster.memory_capacity),
                 lambda t, g=None: dp(t))
    one = H.Candidate(Degrees((1, 1), (1, 2), (2, 1)), 4)
    floor = accumulation_floor(s, one)
    hand = (4 - 1) / 4 * 3 * 2 * numel / (cluster.memory_bandwidth * 0.8)
    assert math.isclose(float(np.sum(floor)), hand, rel_tol=1e-9)
    assert np.all(floor <= accumulated(one, s.stats(one), None, 1.0, 1.0, cluster) * (1 + 1e-12))
    two = H.Candidate(Degrees((2, 1), (1, 2), (1, 1)), 4)
    assert 0 < float(np.sum(accumulation_floor(s, two))) <= float(
        np.sum(accumulated(two, s.stats(two), None, 1.0, 1.0, cluster))) * (1 + 1e-12)
