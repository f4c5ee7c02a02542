"""How the hierarchical search's tensor groups keep their activations: sequence parallelism (every
saved activation at 1/t, taken where the plain layout does not fit) and attention-only
recomputation. Expected figures are hand counts of what each op's backward reads, checked
against torch's own saved tensors, not read back from the code under test."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autopar
from autopar.core.cluster import Cluster
from autopar.core.strategy import RECOMPUTE_ATTENTION, Degrees
from autopar.planning import hierarchical as H
from autopar.planning.activations import price_fitting, sequence_parallel
from autopar.planning.step_price import Candidate, price
from autopar.search.dp import dp

B, S, W, HEADS, LAYERS = 2, 64, 128, 4, 3
T = 4
CLUSTER = Cluster.preset("1x4xA100")


class Block(nn.Module):
    """Megatron's MLP block: a norm, a column- and a row-parallel linear around a GELU."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(W)
        self.fc1 = nn.Linear(W, 4 * W)
        self.fc2 = nn.Linear(4 * W, W)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.pow(2).mean()


def _search(model, inputs, graph=None):
    g = graph or autopar.trace(model, inputs)
    return H.Search(g, CLUSTER, "fp32", "adam", "train", 1e30, lambda t, g=None: dp(t))


def _unit(search, path):
    return search.unit_names().index(path)


def _torch_saved_bytes(block, x) -> int:
    """Bytes of the distinct tensors autograd saves in the block's forward, its parameters and its
    input left out."""
    saved = {}

    def pack(t):
        st = t.untyped_storage()
        saved[st.data_ptr()] = max(saved.get(st.data_ptr(), 0), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    own = {p.untyped_storage().data_ptr() for p in block.parameters()} | {x.untyped_storage().data_ptr()}
    return sum(v for k, v in saved.items() if k not in own)


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(B, S, W)
    return model, x, _search(model, (x,))


def test_sequence_parallelism_keeps_every_saved_activation_at_1_over_t_of_the_hand_count(mlp):
    """Per block and sequence, what the backward reads (fp32): the norm's input (s h), the first
    linear's input (s h), the GELU's input (4 s h), the second linear's input (4 s h): 10 s h
    elements, and the norm's mean and reciprocal deviation (2 s) that torch keeps beside them
    (the cost model leaves those out). Under sequence parallelism over t devices every one of
    them is 1/t; the group's time-optimal layout keeps the first linear's input whole."""
    model, x, s = mlp
    sbh = B * S * W
    hand = 10 * sbh * 4
    stats = 2 * B * S * 4
    xin = torch.randn(B, S, W, requires_grad=True)
    assert _torch_saved_bytes(model.blocks[1], xin) + B * S * W * 4 == hand + stats  # the input: the norm's
    u = _unit(s, "blocks.1")
    one = s._stats((1, 1), 1, False)
    assert one.acts[u] == pytest.approx(hand, rel=1e-9)
    four = s._stats((T, 1), 1, False)
    assert four.sp_acts[u] == pytest.approx(hand / T, rel=1e-9)
    assert four.acts[u] > four.sp_acts[u] * (1 + 1e-6)  # the plain layout keeps something whole
    assert four.sp_comm[u] > 0  # and gathers it again in the backward


def test_the_price_takes_sequence_parallelism_only_where_the_plain_layout_does_not_fit(mlp):
    """Between the sequence-parallel layout's memory and the plain one's, the price is the
    sequence-parallel one's (slower by its gathers, fitting); with room for the plain layout,
    the plain one (never slower)."""
    _, _, s = mlp
    c = Candidate(Degrees((T,), (1,), (1,)), 1)
    st = s.stats(c)
    args = (CLUSTER, 0, s.optimizer, s.master, s.itemsize)
    plain = price(c, st, CLUSTER, 1e30, s.optimizer, s.master, s.itemsize)
    sp = price(c, sequence_parallel(st), CLUSTER, 1e30, s.optimizer, s.master, s.itemsize)
    assert sp.memory < plain.memory and sp.cost > plain.cost
    roomy = price_fitting(c, st, CLUSTER, plain.memory * 1.01, *args[2:])
    assert not roomy.sequence_parallel and roomy.cost == pytest.approx(plain.cost)
    tight = price_fitting(c, st, CLUSTER, (sp.memory + plain.memory) / 2, *args[2:])
    assert tight.sequence_parallel and tight.fits and tight.cost == pytest.approx(sp.cost)
    assert tight.terms["tensor-parallel communication"] == pytest.approx(
        plain.terms["tensor-parallel communication"] + float(st.sp_comm.sum()), rel=1e-9)


@pytest.fixture(scope="module")
def manual_gpt():
    model, inputs = autopar.zoo.get("gpt", layers=LAYERS, width=W, heads=HEADS, seq=S, batch=B, vocab=256,
                                    attention="manual", device="meta")
    return _search(model, inputs)


def test_attention_only_recompute_keeps_the_attentions_inputs_and_reruns_its_matmuls(manual_gpt):
    """A GPT block without dropout, fp32, one device: without recomputation its backward reads
    the first norm's input, the QKV linear's input, q, k, v, the softmax's output (a s^2 per
    sequence), the projection's input, the second norm's input, the first MLP linear's input,
    the GELU's input and the second linear's (4 s h each): 16 s h + a s^2 elements, and more
    where an op keeps a tensor its backward does not read. Recomputing the attention's core
    keeps q, k and v only: 16 s h exactly (Korthikanti et al. 2022: the 5 a s / h term gone),
    for its two matmuls' forward again (2 x 2 b s^2 h FLOPs per layer)."""
    s = manual_gpt
    assert s.attention
    u = _unit(s, "blocks.1")
    sbh = B * S * W
    plain = s._stats((1, 1), 1, False)
    attn = s._stats((1, 1), 1, RECOMPUTE_ATTENTION)
    assert attn.acts[u] == pytest.approx(16 * sbh * 4, rel=1e-9)
    assert plain.acts[u] >= (16 * sbh + HEADS * S * S * B) * 4
    # while its backward runs, the block holds its recomputed core's activations again
    assert attn.full_acts[u] >= plain.acts[u] * (1 - 1e-9)
    matmuls = 4 * B * S * S * W
    assert LAYERS * matmuls <= s.totals.attention_flops <= LAYERS * matmuls * 1.05
    extra = attn.compute[u] - plain.compute[u]
    peak = CLUSTER.peak("float32") * s.eff
    assert extra >= matmuls / peak * (1 - 1e-9)
    full = s._stats((1, 1), 1, True)
    assert extra < full.compute[u] - plain.compute[u]  # less than re-running the whole block


def test_attention_only_recompute_is_searched_where_attention_writes_its_scores_out():
    """A fused attention kernel keeps no scores: nothing for the option to drop, so the search
    does not offer it; a written-out attention gets it, and the lower bound counts its FLOPs."""
    model, inputs = autopar.zoo.get("gpt", layers=LAYERS, width=W, heads=HEADS, seq=S, batch=B, vocab=256,
                                    attention="sdpa", device="meta")
    assert not _search(model, inputs).attention
    model, inputs = autopar.zoo.get("gpt", layers=LAYERS, width=W, heads=HEADS, seq=S, batch=B, vocab=256,
                                    attention="manual", device="meta")
    s = _search(model, inputs)
    opts = [c.recompute for _, _, _, c in s.candidates(None, (0,), (False, True, RECOMPUTE_ATTENTION))]
    assert RECOMPUTE_ATTENTION in opts
    c = Candidate(Degrees((1,), (1,), (4,)), 1, recompute=RECOMPUTE_ATTENTION)
    assert dataclasses.replace(c, recompute=False).describe() != c.describe()
    assert "attention-only" in c.describe()


def test_a_pinned_attention_only_recompute_is_the_plans_training_option():
    """``recompute=attention`` in a pin reaches the plan: its options say so, and its hardware
    FLOPs add the attention cores' forward, not the blocks'."""
    model, inputs = autopar.zoo.get("gpt", layers=LAYERS, width=W, heads=HEADS, seq=S, batch=B * 8, vocab=256,
                                    attention="manual", device="meta")
    plan = autopar.plan(model, inputs, Cluster.preset("2x8xA100"), hierarchical=True, precision="bf16",
                        pin="tensor=2,pipeline=1,zero=0,recompute=attention")
    st = plan.baselines["published"].strategy
    assert st.options.recompute == RECOMPUTE_ATTENTION
    assert "attention-only" in st.options.describe()
    matmuls = 4 * (B * 8) * S * S * W * LAYERS
    assert matmuls <= st.hardware_flops - st.model_flops <= matmuls * 1.05
