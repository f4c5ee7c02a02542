"""PaSE's four zoo models and the PaSE canonical view (docs/pase.md §7).

The expected node/edge counts, op kinds and per-node domains are copied from pase.md §7, not
computed: the hand-built graphs (``pase_reference``) and ``pase_view(trace(model))`` must both
match them, and must match each other node for node.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

import autopar
from autopar.pase.reference import REFERENCE_GRAPHS, alexnet_graph, rnnlm_graph

SMALL = {
    "alexnet": dict(batch=2, image=67, fc=32, classes=10),
    "inception3": dict(batch=2, image=75, classes=10),
    "rnnlm": dict(batch=2, seq=5, vocab=30, units=16),
    "transformer": dict(batch=2, seq=6, vocab=30, width=16, heads=2, hidden=32, layers=2),
}
PASE_SIZES = {"alexnet": 128, "inception3": 128, "rnnlm": 64, "transformer": 64}

COUNTS = {  # name: (nodes, edges, op kinds that must be exact)
    "alexnet": (14, 13, {"Conv": 5, "Pool": 3, "Ravel": 1, "Unravel": 1, "FC": 3,
                         "SoftmaxCrossEntropy": 1}),
    "rnnlm": (4, 3, {"Embedding": 1, "LSTM": 1, "FC": 1, "SoftmaxCrossEntropy": 1}),
    "inception3": (219, 253, {"Conv": 94, "Norm": 94, "Pool": 13, "Concat": 15, "ReduceMean": 1,
                              "FC": 1, "SoftmaxCrossEntropy": 1}),
    # 2 embeddings + 2 +pos, 6 x (8 + 4) encoder, 6 x (8 + 9 + 4) decoder, final einsum, loss
    "transformer": (204, 256, {"Embedding": 2, "Stack": 6, "Unstack": 18, "Softmax": 18,
                               "Norm": 30, "Elementwise": 32, "Einsum": 97,
                               "SoftmaxCrossEntropy": 1}),
}

B = 128
ALEXNET_TABLE = [  # pase.md §7.1: (op, D, output shape, w)
    ("Conv", (B, 3, 55, 55, 11, 11, 96), (B, 96, 55, 55), 1),
    ("Pool", (B, 96, 27, 27), (B, 96, 27, 27), 0),
    ("Conv", (B, 96, 27, 27, 5, 5, 256), (B, 256, 27, 27), 1),
    ("Pool", (B, 256, 13, 13), (B, 256, 13, 13), 0),
    ("Conv", (B, 256, 13, 13, 3, 3, 384), (B, 384, 13, 13), 1),
    ("Conv", (B, 384, 13, 13, 3, 3, 384), (B, 384, 13, 13), 1),
    ("Conv", (B, 384, 13, 13, 3, 3, 256), (B, 256, 13, 13), 1),
    ("Pool", (B, 256, 6, 6), (B, 256, 6, 6), 0),
    ("Ravel", (B, 256, 6, 6), (9216 * B,), 0),
    ("Unravel", (B, 9216), (B, 9216), 0),
    ("FC", (B, 4096, 9216), (B, 4096), 1),
    ("FC", (B, 4096, 4096), (B, 4096), 1),
    ("FC", (B, 1024, 4096), (B, 1024), 0),
    ("SoftmaxCrossEntropy", (B, 1024), (B, 1024), 0),
]
RNNLM_TABLE = [  # pase.md §7.2
    ("Embedding", (64, 256, 2048, 100000), (64, 256, 2048), 0),
    ("LSTM", (2, 256, 64, 2048, 2048), (64, 256, 2048), 3),
    ("FC", (64, 256, 100000, 2048), (64, 256, 100000), 0),
    ("SoftmaxCrossEntropy", (64, 256, 100000), (64, 256, 100000), 0),
]


@functools.lru_cache(maxsize=None)
def traced(name: str):
    from autopar.pase.view import pase_view

    model, inputs = autopar.zoo.get(name, batch=PASE_SIZES[name], device="meta")
    return pase_view(autopar.trace(model, inputs), name)


def reference(name: str):
    return REFERENCE_GRAPHS[name](PASE_SIZES[name])


# --- the zoo models -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(SMALL))
def test_small_model_trains(name):
    model, inputs = autopar.zoo.get(name, **SMALL[name])
    loss = model(*inputs)
    assert loss.dim() == 0 and math.isfinite(loss.item())
    classes = SMALL[name].get("classes", SMALL[name].get("vocab"))
    assert abs(loss.item() - math.log(classes)) < 0.6 * math.log(classes)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("name", list(SMALL))
def test_pase_sizes_on_meta(name):
    model, inputs = autopar.zoo.get(name, device="meta")
    assert all(p.is_meta for p in model.parameters())
    assert inputs[0].shape[0] == PASE_SIZES[name]
    if name == "rnnlm":  # nn.LSTM on meta steps through all 256 positions: check a short one
        model, inputs = autopar.zoo.get(name, seq=4, device="meta")
    assert model(*inputs).shape == ()


def test_pase_defaults_are_pase_sizes():
    assert autopar.zoo.sizes("alexnet")["classes"] == 1024
    s = autopar.zoo.sizes("transformer")
    assert (s["batch"], s["seq"], s["vocab"], s["width"], s["heads"], s["hidden"], s["layers"]) == (
        64, 256, 50000, 512, 8, 2048, 6)
    s = autopar.zoo.sizes("rnnlm")
    assert (s["batch"], s["seq"], s["vocab"], s["units"], s["layers"]) == (64, 256, 100000, 2048, 2)
    assert autopar.zoo.sizes("inception3")["image"] == 299


def test_transformer_qkv_is_one_stacked_einsum():
    model, (src, tgt, labels) = autopar.zoo.get("transformer", **SMALL["transformer"])
    att = model.encoder[0].attn
    assert att.w_qkv.shape == (3, 2, 16, 8) and att.w_o.shape == (2, 16, 8)
    x = torch.randn(2, 6, 16)
    q, k, v = torch.einsum("ble,shek->sbhlk", x, att.w_qkv).unbind(0)
    torch.testing.assert_close(k, torch.einsum("ble,hek->bhlk", x, att.w_qkv[1]))


# --- the hand-built graphs against pase.md §7 ---------------------------------------------------

def _check_counts(g, name):
    nodes, edges, kinds = COUNTS[name]
    assert len(g.nodes) == nodes
    assert len(g.edges) == edges
    assert g.op_counts() == kinds
    assert [n.id for n in g.nodes] == list(range(nodes))


def _check_table(g, table):
    got = [(n.op, n.domain, n.out_shapes[0], n.w) for n in g.nodes]
    assert got == table
    assert set(g.edges) == {(i, i + 1) for i in range(len(table) - 1)}


@pytest.mark.parametrize("name", list(COUNTS))
def test_reference_graph_counts(name):
    _check_counts(reference(name), name)


def test_reference_path_graphs_match_pase_tables():
    _check_table(alexnet_graph(128), ALEXNET_TABLE)
    _check_table(rnnlm_graph(64), RNNLM_TABLE)


def test_reference_transformer_layout():
    g = reference("transformer")
    t = 2  # first encoder layer, pase.md §7.4
    ops = [g.nodes[t + i].op for i in range(12)]
    assert ops == ["Einsum", "Unstack", "Einsum", "Softmax", "Einsum", "Einsum", "Elementwise",
                   "Norm", "Einsum", "Einsum", "Elementwise", "Norm"]
    assert g.nodes[t].domain == (3, 64, 8, 256, 64, 512) and g.nodes[t].batch_axis == 1
    assert g.nodes[t + 8].w == 2 and g.nodes[74].op == "Embedding" and g.nodes[202].domain == (
        64, 256, 50000, 512)
    dec = 76
    assert g.nodes[dec + 8].op == "Stack" and g.nodes[dec + 9].attrs["eq"] == "sble,shek->sbhlk"
    assert (73, dec + 8) in g.edges and (dec + 7, dec + 15) in g.edges  # enc -> Stack, residual


# --- the view of traced models -------------------------------------------------------------------

@pytest.mark.parametrize("name", list(COUNTS))
def test_view_counts(name):
    _check_counts(traced(name), name)


def test_view_path_graphs_match_pase_tables():
    _check_table(traced("alexnet"), ALEXNET_TABLE)
    _check_table(traced("rnnlm"), RNNLM_TABLE)


@pytest.mark.parametrize("name", list(COUNTS))
def test_view_equals_hand_built_graph(name):
    got, want = traced(name), reference(name)
    for a, b in zip(got.signature(), want.signature()):
        assert a == b
    assert set(got.edges.items()) == set(want.edges.items())


def test_view_records_where_nodes_came_from():
    g = traced("alexnet")
    assert all(n.sources for n in g.nodes)
    assert len(g.nodes[0].sources) == 2  # conv1 and its folded ReLU
    assert g.nodes[8].sources == g.nodes[9].sources  # Ravel and Unravel come from one flatten
