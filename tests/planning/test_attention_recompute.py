"""Attention-only (selective) recomputation on the flat path (core/attention_core.py): only each
attention's core (scores, scale, mask, softmax, product with the values) runs again, priced as
its forward again and the scores-sized tensors not kept; the search weighs it beside none and
per-block recomputation."""

from __future__ import annotations

import pytest

import autopar
from autopar.core.attention_core import attention_cores
from autopar.core.blocks import apply_training
from autopar.core.cluster import Cluster
from autopar.core.strategy import TrainingOptions
from autopar.cost_models.analytic import AnalyticModel
from autopar.cost_models.tables import build_tables
from autopar.planning.baselines import data_parallel_choice

B, H, S, LAYERS = 8, 4, 128, 2


@pytest.fixture(scope="module")
def llama():
    model, inputs = autopar.zoo.get("llama", layers=LAYERS, heads=H, attention="manual", batch=B, seq=S)
    return model, inputs, autopar.trace(model, inputs)


def test_the_cores_are_scores_to_values_and_fused_attention_has_none(llama):
    _, _, g = llama
    cores = attention_cores(g)
    assert len(cores) == LAYERS
    for core in cores:
        ops = [g.nodes[i].op for i in core]
        assert ops[0] == "matmul" and ops[-1] == "matmul" and "softmax" in ops
        assert "linear" not in ops  # no linear layer is re-run
    fused = autopar.trace(*autopar.zoo.get("llama", layers=LAYERS))  # scaled_dot_product_attention
    assert attention_cores(fused) == []


def test_attention_recompute_prices_the_cores_forward_again_and_drops_the_scores(llama):
    """Hand count on the data-parallel plan over 8 devices: the step grows by exactly the cores'
    forward time (the same nodes priced for inference), and each layer stops keeping the one
    scores-sized fp32 tensor autograd keeps there (the softmax's output, B x H x S x S / 8: the
    scaling by a number and the masked fill keep no scores, the fill only its bool mask)."""
    _, _, g = llama
    cluster, model = Cluster.preset("8xA100"), AnalyticModel(optimizer="adam")
    plain = build_tables(apply_training(g, TrainingOptions()), cluster, model, space="mesh")
    att = build_tables(apply_training(g, TrainingOptions(recompute="attention")), cluster, model, space="mesh")
    choice = data_parallel_choice(g, plain)
    forward = build_tables(g, cluster, AnalyticModel(), space="mesh", mode="inference")
    again = sum(float(forward.node_cost[i][choice[i]]) for core in attention_cores(g) for i in core)
    assert att.total(choice) - plain.total(choice) == pytest.approx(again, rel=1e-9)
    saved = plain.total_memory(choice) - att.total_memory(choice)
    assert saved >= LAYERS * B * H * S * S * 4 / 8


def test_the_flat_search_weighs_attention_recompute(llama):
    """Searched after no recomputation (which dominates it where memory does not bind), before
    per-block recomputation; a plan pinned to it is slower than none and uses less memory."""
    from autopar.planning.options import dominators, option_sets

    sets = option_sets("fp32", 0, "auto", accumulate=1)
    assert [o.recompute for o in sets][:2] == [False, "attention"]
    assert dominators(TrainingOptions(recompute="attention")) == [TrainingOptions()]
    model, inputs, g = llama
    kw = dict(graph=g, pipeline=False, baselines=False, zero=0, accumulate=1, precision="fp32")
    each = {rc: autopar.plan(model, inputs, "8xA100", recompute=rc, **kw) for rc in (False, "attention")}
    assert each[False].cost < each["attention"].cost
    assert each["attention"].memory_per_device < each[False].memory_per_device
    assert each["attention"].strategy.options.recompute == "attention"
    assert "attention-only recompute" in each["attention"].strategy.options.describe()
    assert autopar.Plan.from_json(each["attention"].to_json()).strategy.options.recompute == "attention"
