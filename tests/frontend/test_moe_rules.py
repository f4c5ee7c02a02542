"""A mixture of experts' routed experts trace to one ``moe_experts`` node (torch.export folds
transformers' grouped_mm / batched_mm code into it), the router's ops all have split rules, and
the node's FLOPs are the routed work that torch's own FLOP counter counts on the same model (each
token through its top-k experts), not every expert on every token."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import autopar
from tests.helpers.moe_models import NAMES, build

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def graphs():
    out = {}
    for name in NAMES:
        model, kwargs = build(name, dtype=torch.float32, layers=2)
        out[name] = (model, kwargs, autopar.trace(model, kwargs))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_the_experts_are_one_node_and_nothing_of_the_moe_is_replicated(graphs, name):
    model, _, graph = graphs[name]
    experts = [n for n in graph.nodes if n.op == "moe_experts"]
    assert [n.module for n in experts] == [f"model.layers.{i}.mlp.experts" for i in range(2)]
    node = experts[0]
    assert [(d.name, d.size, d.splittable) for d in node.dims] == [
        ("tokens", 4 * 8, True), ("experts", 4, True), ("h", 32, False)]
    assert [o.spec.shape for o in node.params] == [tuple(p.shape) for p in
                                                   model.model.layers[0].mlp.experts.parameters()]
    in_moe = [n for n in graph.nodes if ".mlp" in n.module]
    assert not [(n.name, n.unsupported) for n in in_moe if n.op == "opaque"]
    assert {"topk", "softmax", "moe_experts"} <= {n.op for n in in_moe}


@pytest.mark.parametrize("name", NAMES)
def test_routed_flops_are_what_torch_counts(graphs, name):
    model, kwargs, graph = graphs[name]
    with FlopCounterMode(display=False) as counter:
        model(**kwargs)
    counted = {k.split(".", 1)[1]: sum(v.values()) for k, v in counter.get_flop_counts().items()
               if k.endswith(".experts")}
    ours = {n.module: n.flops for n in graph.nodes if n.op == "moe_experts"}
    assert ours == counted
    every_expert_on_every_token = 2 * 4 * 8 * sum(p.numel() for p in model.model.layers[0].mlp.experts.parameters())
    assert ours["model.layers.0.mlp.experts"] * 2 == every_expert_on_every_token  # top-2 of 4 experts


def test_the_folded_graph_still_reads_every_expert_weight(graphs):
    """The fold keeps the weights as the node's parameters, under the model's own names."""
    model, _, graph = graphs["mixtral"]
    node = next(n for n in graph.nodes if n.op == "moe_experts")
    assert [p.source for p in node.params] == [
        "param:model.layers.0.mlp.experts.gate_up_proj", "param:model.layers.0.mlp.experts.down_proj"]
