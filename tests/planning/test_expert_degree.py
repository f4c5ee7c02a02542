"""The expert degree of the hierarchical search: routed experts' FLOPs counted as routed tokens,
the degree enumerated and pinned, its all-to-all priced as the alpha-beta count says, and chosen
where splitting the experts beats replicating them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import autopar
from autopar.core.block_runs import run_window
from autopar.core.blocks import apply_training, block_window, units
from autopar.core.cluster import Cluster
from autopar.core.strategy import Degrees, TrainingOptions
from autopar.core.tables import Config
from autopar.cost_models.analytic import AnalyticModel
from autopar.cost_models.memory import node_memory
from autopar.planning import hierarchical as H
from autopar.planning.degrees import Pin, expert_options, parse_pin
from autopar.planning.routed import expert_count, is_routed
from autopar.planning.step_price import Candidate
from autopar.planning.units import unit_stats
from autopar.search.dp import dp

# large experts, few tokens: the experts' state (its optimizer step, its memory) is what a step is made of
SIZES = dict(batch=64, seq=16, width=128, experts=32, top_k=2, ffn=2048, layers=2, heads=2, kv_heads=2, vocab=64)
SMALL = dict(SIZES, width=64, ffn=512)


@pytest.fixture(scope="module")
def moe64():
    model, inputs = autopar.zoo.get("moe_decoder", device="meta", **SIZES)
    return autopar.trace(model, inputs)


def test_expert_degrees_fill_the_data_devices_innermost_first_and_divide_the_experts():
    assert expert_options((8, 8), 64) == [(), (2, 1), (4, 1), (8, 1), (8, 2), (8, 4), (8, 8)]
    assert expert_options((8, 8), 16) == [(), (2, 1), (4, 1), (8, 1), (8, 2)]
    assert expert_options((1, 4), 8) == [(), (1, 2), (1, 4)]
    deg = Degrees((8, 1), (1, 16), (1, 16), expert=(1, 8))
    assert (deg.ep, deg.expert_data) == (8, (1, 2))
    assert Degrees.from_json(deg.to_json()) == deg
    assert "experts over 8" in deg.describe()
    with pytest.raises(ValueError, match="divisor of data"):
        Degrees((8,), (1,), (4,), expert=(3,))


def test_pin_takes_an_expert_degree():
    pin = parse_pin("tensor=8,expert=8,pipeline=16,data=16")
    assert (pin.tensor, pin.expert, pin.pipeline, pin.data) == (8, 8, 16, 16)
    assert pin.admits(Degrees((8, 1), (1, 16), (1, 16), expert=(1, 8)))
    assert not pin.admits(Degrees((8, 1), (1, 16), (1, 16)))
    with pytest.raises(ValueError, match="expert degree"):
        parse_pin("expert=0")
    with pytest.raises(ValueError, match="not a number"):
        parse_pin("expert=eight")


def test_a_pinned_expert_degree_on_a_dense_model_is_one_clear_error():
    model, inputs = autopar.zoo.get("gpt", layers=2, width=32, heads=2, seq=8, batch=8, vocab=64, device="meta")
    with pytest.raises(ValueError, match="no routed experts"):
        autopar.plan(model, inputs, "8xH100", pin="expert=2")


def test_routed_experts_flops_are_the_routed_tokens_of_a_real_dispatch():
    """The graph's expert FLOPs equal torch's FLOP counter on the same layer run expert by
    expert on the tokens its router sends there (real routing: uneven loads, the same total)."""
    torch.manual_seed(0)
    model, (idx, labels) = autopar.zoo.get("moe_decoder", batch=2, seq=16, width=32, experts=8, top_k=2, ffn=48,
                                           layers=2, heads=2, kv_heads=2, vocab=64)
    graph = autopar.trace(model, (idx, labels))
    counted = sum(n.flops for n in graph.nodes if is_routed(n))
    moe = model.layers[0].mlp
    x = torch.randn(2, 16, 32)
    gate, chosen = torch.topk(F.softmax(moe.router(x), dim=-1), moe.top_k, dim=-1)
    flat = x.reshape(-1, 32)
    with FlopCounterMode(display=False) as fc:
        for e in range(8):
            rows = (chosen.reshape(-1, moe.top_k) == e).any(-1).nonzero().flatten()
            xe = flat[rows]
            w = moe.experts
            (F.silu(xe @ w.w1[e]) * (xe @ w.w3[e])) @ w.w2[e]
    per_layer = fc.get_total_flops()
    assert expert_count(graph) == 8
    assert counted == 2 * per_layer  # two MoE layers
    dense = 3 * 2 * (2 * 16) * 8 * 32 * 48  # every expert on every token
    assert counted == pytest.approx(2 * dense * moe.top_k / 8)


def _search(graph, cluster):
    return H.Search(graph, cluster, "bf16", "adam", "train", cluster.memory_capacity, lambda t, g=None: dp(t))


def test_all_to_all_price_is_the_alpha_beta_count(moe64):
    """Per MoE layer and microbatch: dispatch + combine, forward and backward, each an all-to-all
    of tokens x top_k x hidden bf16 bytes per device over the expert group: each peer's 1/ep of
    them on the link to that peer, the in-node and the cross-node shares at once, the latency of
    ep - 1 steps of the slowest link."""
    cluster = Cluster.preset("2x4xH100")
    s = _search(moe64, cluster)
    b, seq, k, h, layers = SIZES["batch"], SIZES["seq"], SIZES["top_k"], SIZES["width"], SIZES["layers"]
    (nv, nv_lat), (ib, ib_lat) = cluster.link(False), cluster.link(True)
    for expert in ((4, 1), (4, 2)):
        deg = Degrees((1, 1), (1, 1), (4, 2), expert=expert)
        m = 2
        pr = s.price(Candidate(deg, m))
        ep = deg.ep
        nbytes = b // (deg.d * m) * seq * k * h * 2
        if expert == (4, 1):  # 3 peers in the node
            one = 3 / 4 * nbytes / nv + 3 * nv_lat + cluster.call_latency
        else:  # 3 peers in the node over NVLink, 4 in the other over the NIC, at once
            one = max(3 / 8 * nbytes / nv, 4 / 8 * nbytes / ib) + 7 * ib_lat + cluster.call_latency
        assert pr.terms["expert all-to-all"] == pytest.approx(m * layers * 4 * one, rel=1e-9)
        recomputed = s.price(Candidate(deg, m, recompute=True))
        assert recomputed.terms["expert all-to-all"] == pytest.approx(m * layers * 6 * one, rel=1e-9)
    assert "expert all-to-all" not in s.price(Candidate(Degrees((1, 1), (1, 1), (4, 2)), 2)).terms


def test_expert_parallelism_is_chosen_where_it_beats_replicated_experts(moe64):
    """64 devices, few tokens and large experts: splitting the experts over the data devices
    cuts their optimizer step and state by more than the all-to-alls cost (their gradient sync
    is no cheaper: a ring of one rank per node moves 1/ep of the bytes over 1/ep of the links a
    ring over every device has); the search finds it, and it is faster and smaller than the best
    plan with the experts replicated."""
    cluster = Cluster.preset("8x8xH100")
    s = _search(moe64, cluster)
    pin = Pin(tensor=1, pipeline=1, microbatch=1)
    best, _, _, _ = s.best(pin, (0,), (False,))
    replicated, _, _, _ = s.best(dataclasses.replace(pin, expert=1), (0,), (False,))
    assert best.candidate.degrees.ep > 1
    assert best.cost < replicated.cost
    assert best.memory < replicated.memory
    assert best.terms["optimizer step"] < replicated.terms["optimizer step"]


def test_branch_and_bound_stays_exact_with_the_expert_degree(moe64):
    """Every candidate priced, no bounds: the same best as the pruned search, so the bounds stay
    below the price of expert-parallel candidates (their smaller state and sync); with memory for
    the replicated experts and without it."""
    cluster = Cluster.preset("8x8xH100")
    s = _search(moe64, cluster)
    pin = Pin(tensor=1, pipeline=1, microbatch=1)
    everything = [s.price(c) for _, _, _, c in s.candidates(pin, (0, 1), (False,))]
    replicated = min(p.memory for p in everything if p.candidate.degrees.ep == 1)
    for capacity in (cluster.memory_capacity, 0.99 * replicated):
        s.capacity = capacity
        best, _, _, closed = s.best(pin, (0, 1), (False,))
        fitting = [p for p in everything if p.memory <= capacity]
        assert closed and best.cost == pytest.approx(min(p.cost for p in fitting), rel=1e-12)
    assert best.candidate.degrees.ep > 1  # only split experts fit


def test_window_over_runs_of_dense_and_moe_layers_stands_for_the_whole_graph():
    """Two dense layers, then five MoE layers: the window keeps both dense layers and three MoE
    layers, and its unit figures spread over every layer equal solving the whole graph."""
    model, inputs = autopar.zoo.get("moe_decoder", device="meta", **dict(SMALL, batch=8, layers=7, dense=2, shared=1))
    g = apply_training(autopar.trace(model, inputs), TrainingOptions(precision="bf16", recompute=True))
    spans = units(g)
    win = run_window(g)
    assert block_window(g) is None and win is not None
    assert len(win.spans) == len(spans) - 2 and len(win.graph.nodes) < len(g.nodes)
    cluster = Cluster.preset("2x4xH100")
    model_ = AnalyticModel(sync_scale=0.0)
    full = unit_stats(g, spans, cluster, (4, 1), 2, model_, lambda t, g=None: dp(t))
    part = unit_stats(g, spans, cluster, (4, 1), 2, model_, lambda t, g=None: dp(t), window=win)
    for f in ("compute", "comm", "sync", "params", "grads", "optimizer", "acts", "full_acts", "numel", "boundary"):
        np.testing.assert_allclose(getattr(part, f), getattr(full, f), rtol=1e-9, err_msg=f)


def test_the_dispatch_scales_with_the_microbatch():
    """The MoE graph at 1/8 of its batch (as the search prices a microbatch) has the shapes of the
    same model traced at that batch: the routing's index tensors carry the batch dim, so none is
    priced at the full batch (the sort of each sequence's assignments too: rules/sort.py)."""
    from autopar.core.batch import scale_batch

    sizes = dict(SIZES, layers=2, seq=16)
    big = autopar.trace(*autopar.zoo.get("moe_decoder", device="meta", **dict(sizes, batch=8)))
    small = autopar.trace(*autopar.zoo.get("moe_decoder", device="meta", **dict(sizes, batch=1)))
    scaled = scale_batch(big, 8)
    differ = [a.name for a, b in zip(scaled.nodes, small.nodes) if [o.shape for o in a.outputs] != [o.shape for o in b.outputs]]
    assert [n.name for n in scaled.nodes] == [n.name for n in small.nodes]
    assert not differ


def test_zero3_parameters_are_priced_as_slices_and_two_blocks_whole(moe64):
    """The program gathers ZeRO-3 parameters one block at a time (codegen/zero_units.py, as
    ``fully_shard`` on each block): a rank stores the 1/d slices (the experts' 1/(ep x d/ep)) and
    holds whole only the root's (prologue, epilogue) and the two largest blocks' parameters and
    gradients, the experts' divided by the expert degree; counted here per unit from the units'
    statistics and the units' names."""
    cluster = Cluster.preset("8x8xH100")
    s = _search(moe64, cluster)
    names = s.unit_names()
    roots = [n in ("prologue", "epilogue") for n in names]
    assert sum(roots) == 2 and len(names) >= 4
    for expert in ((), (8, 1)):
        deg = Degrees((1, 1), (1, 1), (8, 8), expert=expert)
        z3 = s.price(Candidate(deg, 1, zero=3))
        stats = s.stats(Candidate(deg, 1))
        if expert:
            ex = s.expert_stats(Candidate(deg, 1))
            dense = stats.params - ex.params
            slices = float(np.sum(dense)) / 64 + float(np.sum(ex.params)) / 64
            whole = dense + (stats.grads - ex.grads) + (ex.params + ex.grads) / 8
        else:
            slices = float(np.sum(stats.params)) / 64
            whole = stats.params + stats.grads
        blocks = sorted((float(w) for w, r in zip(whole, roots) if not r), reverse=True)
        held = sum(float(w) for w, r in zip(whole, roots) if r) + blocks[0] + blocks[1]
        assert z3.memory_terms["parameters"] == pytest.approx(slices, rel=1e-9)
        assert z3.memory_terms["transient (recomputed block, gathered ZeRO-3 parameters)"] == pytest.approx(held, rel=1e-9)


def test_an_expert_list_is_priced_as_its_stacked_form():
    """Experts written as a list of modules hold the same weights as the stacked form, and each
    rank of an expert group stores only its own experts' (codegen/expert_weights.py), so the
    predicted memory (the hierarchical price, whole and split over 8 experts' ranks, and the flat
    planner's per-node memory under a cut of the experts) is the stacked form's."""
    cluster = Cluster.preset("8x8xH100")
    split, whole = Degrees((1, 1), (1, 1), (8, 8), expert=(8, 1)), Degrees((1, 1), (1, 1), (8, 8))
    prices, nodes = {}, {}
    for listed in (False, True):
        model, inputs = autopar.zoo.get("moe", batch=64, seq=16, width=64, hidden=256, experts=8, top_k=2,
                                        layers=2, listed=listed)
        graph = autopar.trace(model, inputs)
        s = _search(graph, cluster)
        prices[listed] = [s.price(Candidate(d, 1)) for d in (split, whole)]
        node = next(n for n in graph.nodes if n.op == "moe_experts")
        mesh = Cluster.preset("cpu", devices=8).mesh()
        names = [d.name for d in node.dims]
        every = tuple(range(len(mesh.shape)))  # the experts cut over all 8 devices
        cut = Config(tuple(8 if d == "experts" else 1 for d in names),
                     tuple(every if d == "experts" else () for d in names))
        nodes[listed] = [node_memory(node, c, mesh) for c in (cut, Config((1,) * len(names), ((),) * len(names)))]
    for (a, b) in zip(prices[True], prices[False]):
        assert a.memory == pytest.approx(b.memory, rel=1e-12)
        assert a.memory_terms["parameters"] == pytest.approx(b.memory_terms["parameters"], rel=1e-12)
    assert prices[True][0].memory_terms["parameters"] < prices[True][1].memory_terms["parameters"] / 4
    for (a, b) in zip(nodes[True], nodes[False]):
        assert (a.params, a.grads, a.optimizer) == pytest.approx((b.params, b.grads, b.optimizer), rel=1e-12)
    assert nodes[True][0].params == pytest.approx(nodes[True][1].params / 8, rel=1e-12)
