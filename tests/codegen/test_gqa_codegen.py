"""Grouped-query attention in the fused kernel (``enable_gqa``, the zoo Llama's default), split
by hand as Megatron-LM splits attention: column-parallel q/k/v projections, the attention by its
key/value heads (each rank runs its groups' query heads), a row-parallel output projection; the
compiled ranks train like one device (2 threaded ranks)."""

from __future__ import annotations

import autopar
from tests.helpers.dist_utils import run_threaded
from tests.helpers.numerics import check_rank, reference_run
from tests.helpers.plans import follow


def test_grouped_key_value_heads_split_over_ranks_train_like_one_device():
    model, inputs = autopar.zoo.get("llama", batch=2, seq=8, width=32, heads=4, kv_heads=2, ffn=48, layers=1,
                                    vocab=64)
    graph = autopar.trace(model, inputs)
    attention = [n for n in graph.nodes if n.op == "sdpa"]
    assert attention and all(n.attrs.get("enable_gqa") for n in attention)
    assert all(n.inputs[1].spec.shape[1] == 2 for n in attention)  # keys at the 2 kv heads, not expanded
    pins = {}
    for n in graph.nodes:
        if n.op == "linear" and n.module.endswith(("wq", "wk", "wv")):
            pins[n.name] = {"n": (0,)}
        elif n.op == "linear" and n.module.endswith("wo"):
            pins[n.name] = {"k": (0,)}
        elif n.op == "sdpa":
            pins[n.name] = {"h": (0,)}
    assignment = follow(graph, (2,), pins)
    run_threaded(check_rank, 2, model, inputs, graph, assignment, (2,), reference_run(model, inputs))
