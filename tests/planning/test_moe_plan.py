"""Expert parallelism is searched and priced: a Mixtral-shaped model (hidden 1024, 8 experts,
top-2, sequence 4096, batch 8; one layer, to plan in seconds) on 8xH100
splits its experts over the devices, replicates none of its mixture-of-experts ops, and is
predicted faster than the same search with the experts' weights kept whole; the all-to-alls are
in the price, as alpha-beta collectives of the routed tokens."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

import autopar
from autopar.cost_models.analytic import AnalyticModel
from tests.helpers.moe_models import build

pytest.importorskip("transformers")

EIGHT = "8xH100"


@pytest.fixture(scope="module")
def mixtral():
    return build("mixtral", batch=8, seq=4096, dtype=torch.float32, device="meta", experts=8, hidden_size=1024,
                 intermediate_size=3584, vocab_size=32000, num_attention_heads=16, num_key_value_heads=8,
                 max_position_embeddings=4096, implementation="grouped_mm")


def _whole_experts(graph):
    """The same graph with the experts' dim unsplittable: every device runs every expert."""
    def whole(node):
        if node.op != "moe_experts":
            return node
        dims = tuple(dataclasses.replace(d, splittable=False) if d.name == "experts" else d for d in node.dims)
        return dataclasses.replace(node, dims=dims)

    out = copy.copy(graph)
    out.nodes = [whole(n) for n in graph.nodes]
    return out


@pytest.fixture(scope="module")
def plans(mixtral):
    model, kwargs = mixtral
    best = autopar.plan(model, kwargs, EIGHT, pipeline=False)
    whole = autopar.plan(model, kwargs, EIGHT, pipeline=False, graph=_whole_experts(best.graph))
    return best, whole


def test_the_experts_are_split_and_no_moe_op_is_replicated(plans):
    best, _ = plans
    moe = [n for n in best.graph.nodes if ".mlp" in n.module]
    assert not [n.name for n in moe if n.op == "opaque"]
    # every op of the router and the experts runs split (tokens or experts), none whole on every device
    assert not [n.name for n in moe if math.prod(best.assignment[n.name].splits) == 1]
    (experts,) = [n for n in moe if n.op == "moe_experts"]
    cfg = best.assignment[experts.name]
    assert dict(zip([d.name for d in experts.dims], cfg.splits))["experts"] == 8
    row = next(r for r in best.rows if r.name == experts.name)
    assert "experts/8" in row.split
    assert "experts/8" in best.report()
    assert "uniform routing assumed" in best.report()  # the load-balance assumption, stated


def test_expert_parallelism_is_predicted_faster_than_whole_experts(plans):
    best, whole = plans
    assert best.cost < whole.cost
    (experts,) = [n for n in whole.graph.nodes if n.op == "moe_experts"]
    assert dict(zip([d.name for d in experts.dims], whole.assignment[experts.name].splits))["experts"] == 1


def test_the_all_to_alls_are_priced_as_alpha_beta_collectives(plans):
    best, _ = plans
    (node,) = [n for n in best.graph.nodes if n.op == "moe_experts"]
    cluster = autopar.Cluster.preset(EIGHT)
    cfg = best.assignment[node.name]
    terms = AnalyticModel().node_breakdown(node, cfg, cluster).terms
    (exchange,) = [t for t in terms if t.kind == "exchange"]
    splits = dict(zip([d.name for d in node.dims], cfg.splits))
    tokens, hidden = node.inputs[0].spec.shape
    rows = tokens / (splits["tokens"] * splits["experts"]) * 2  # this rank's tokens x top-2
    p = 8
    bw, lat, call = cluster.intra_bandwidth, cluster.intra_latency, cluster.call_latency

    def one(nbytes):  # (p-1)/p N / bw + (p-1) a, and the call
        return (p - 1) / p * nbytes / bw + (p - 1) * lat + call

    sent = [8 * p, rows * 8] + [rows * hidden * 4] * 4  # counts, expert ids, dispatch/combine and gradients
    assert math.isclose(exchange.seconds, sum(one(n) for n in sent), rel_tol=1e-9)
