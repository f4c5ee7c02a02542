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
