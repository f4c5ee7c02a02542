"""GPT and CNN, traced by ``autopar.trace``, sharded and trained against a single-device run.

Plans (``tests/helpers/plans.py``): data parallel; Megatron (attention heads split from the
q/k/v views on, column/row-parallel MLP, so every block ends in an all-reduce of partial sums);
vocab-parallel embedding + head with a forced row-split fc1 (reduction splits that do not come
in Megatron's pairs); channel-parallel convolutions (out-channel split, then in-channel split
leaving partial sums) with batch norm on split channels; minor dims of merged view axes cut
(strided blocks in and out); on 4 ranks each combined with data
parallelism on the other mesh axis. Batch norm with a split batch uses global statistics.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autopar
from autopar.codegen.module import shard_module
from autopar.codegen.placements import node_layout
from tests.helpers.dist_utils import run_threaded
from tests.helpers.numerics import check_rank, reference_run
from tests.helpers.plans import data_parallel, follow

GPT = dict(layers=1, batch=4, seq=8, width=16, heads=2, vocab=32)
CNN = dict(blocks=1, batch=4, channels=4, image=8)


def megatron_gpt(graph, tp, dp):
    """Heads split at the q/k/v views, fc1 column-parallel; the rest follows."""
    pins = {}
    for n in graph.nodes:
        if n.op == "linear" and n.module.endswith("fc1"):
            pins[n.name] = {"n": tp}
        if n.op == "view" and n.inputs[0].source == "split":
            pins[n.name] = {n.outputs[0].axes[2][0]: tp}  # (b, s, h, d): the head axis
    return follow(graph, _mesh(tp, dp), pins, dp)


def vocab_gpt(graph, tp, dp):
    return follow(graph, _mesh(tp, dp), {"tok": {"v": tp}, "head": {"n": tp},
                                         "blocks_0_fc1": {"k": tp}}, dp)


def strided_gpt(graph, tp, dp):
    """Minor dims of merged axes cut: the per-head dim d at the q/k/v views (input (h*d) cut on
    d: strided blocks) and at the merging views (attention output, logits, labels: outputs
    whose merged axis is cut on its minor dim, so partial with zeros around the blocks)."""
    pins = {}
    for n in graph.nodes:
        if n.op == "view" and n.inputs[0].source == "split":
            pins[n.name] = {n.outputs[0].axes[3][0]: tp}
        elif n.op == "view" and any(len(ax) > 1 for ax in n.outputs[0].axes):
            merged = next(ax for ax in n.outputs[0].axes if len(ax) > 1)
            pins[n.name] = {merged[1]: tp}
    return follow(graph, _mesh(tp, dp), pins, dp)


def channels_cnn(graph, tp, dp):
    pins = {n.name: {"c_out": tp} for n in graph.nodes if n.name in ("stem", "blocks_0_conv2")}
    return follow(graph, _mesh(tp, dp), pins, dp)


def _mesh(tp, dp):
    return (2,) * (len(tp) + len(dp))


PLANS = {
    "data_parallel": lambda g, tp, dp: data_parallel(g, _mesh(tp, dp)),
    "megatron": megatron_gpt,
    "vocab_parallel": vocab_gpt,
    "channels": channels_cnn,
    "strided": strided_gpt,
}

CASES = [
    ("gpt", {}, "data_parallel", 2), ("gpt", {}, "megatron", 2), ("gpt", {}, "megatron", 4),
    ("gpt", {"attention": "manual"}, "megatron", 2), ("gpt", {}, "vocab_parallel", 4),
    ("gpt", {}, "strided", 2), ("gpt", {}, "strided", 4),
    ("cnn", {}, "data_parallel", 2), ("cnn", {}, "channels", 2), ("cnn", {}, "channels", 4),
]


@pytest.fixture(scope="module")
def traced():
    cache = {}

    def get(name, extra):
        key = (name, tuple(sorted(extra.items())))
        if key not in cache:
            model, inputs = autopar.zoo.get(name, **(GPT if name == "gpt" else CNN), **extra)
            cache[key] = model, inputs, autopar.trace(model, inputs), reference_run(model, inputs)
        return cache[key]
    return get


@pytest.mark.parametrize("name,extra,plan,world", CASES,
                         ids=[f"{n}{'-' + '-'.join(e.values()) if e else ''}-{p}-{w}"
                              for n, e, p, w in CASES])
def test_model_plan_matches_single_device(traced, name, extra, plan, world):
    model, inputs, graph, ref = traced(name, extra)
    tp, dp = ((0,), ()) if world == 2 else ((1,), (0,))
    if plan == "data_parallel":
        tp, dp = (), tuple(range(len(tp) + len(dp)))
    assignment = PLANS[plan](graph, tp, dp)
    assert any(c.devices > 1 for c in assignment.values())
    if plan == "strided":  # the plan really cuts minor dims, in and out
        layouts = {n.name: node_layout(n, assignment.get(n.name), _mesh(tp, dp)) for n in graph}
        assert any(any(c) for lay in layouts.values() for c in lay.input_strided)
        assert any(any(c) for lay in layouts.values() for c in lay.output_strided)
    run_threaded(check_rank, world, model, inputs, graph, assignment, _mesh(tp, dp), ref)


class Tied(nn.Module):
    """An embedding and an output layer sharing one weight, as GPT-2 does."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(8, 16, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, idx, labels):
        logits = self.out(F.relu(self.fc(self.emb(idx))))
        return F.cross_entropy(logits.view(-1, 16), labels.view(-1))


def tied_rank(rank, world, model, inputs, graph, plan, ref):
    check_rank(rank, world, model, inputs, graph, plan, (2,), ref)
    sharded = shard_module(model, graph, plan, (2,))
    assert sharded.out.weight is sharded.emb.weight  # still one parameter
    torch.testing.assert_close(sharded(inputs[0], labels=inputs[1]), ref.losses[0])  # keywords


def test_tied_weights_stay_one_parameter():
    torch.manual_seed(0)
    model = Tied()
    inputs = (torch.randint(0, 16, (4, 3)), torch.randint(0, 16, (4, 3)))
    graph = autopar.trace(model, inputs)
    # the shared weight is stored vocab-split (the embedding reads it first); the output layer
    # reads it split on its reduction dim instead, so it is redistributed both ways
    plan = follow(graph, (2,), {"emb": {"v": (0,)}, "fc": {"n": (0,)}})
    run_threaded(tied_rank, 2, model, inputs, graph, plan, reference_run(model, inputs))
