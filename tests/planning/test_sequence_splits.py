"""Sequence and context parallelism, chosen by the search and named in the report.

A 2-layer Llama of width 1024 with 4 heads and an MLP of 8192 (heavy enough that sharding its
weights pays over updating them whole on every device) over 32,768 tokens (batch 1) on 8xH100,
built on the meta device: there is no batch to split and too few heads for 8 devices, so the plan splits the
sequence. Attention runs its query rows split with the keys and values all-gathered (context
parallelism), and the MLP's column- and row-parallel linears split their hidden units over a
mesh axis that the norms and the residual stream split along the sequence (Megatron's sequence
parallelism): an all-gather into the column-parallel linear and a reduce-scatter out of the
row-parallel one, where tensor parallelism alone would all-reduce.
"""

from __future__ import annotations

import functools

import pytest
import torch

import autopar
from autopar.core.margin import usable_memory
from autopar.core.sequence import sequence_dims
from autopar.cost_models.collectives import predicted_collectives

pytest.importorskip("transformers")

SEQ = 32768


@functools.lru_cache(maxsize=None)
def _plan():
    import transformers as T

    from tests.helpers.hf_models import transformers_quiet

    transformers_quiet()
    cfg = T.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=8192, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQ,
                        attn_implementation="sdpa")
    with torch.device("meta"):
        model = T.LlamaForCausalLM(cfg).train()
    ids = torch.zeros((1, SEQ), dtype=torch.long, device="meta")
    return autopar.plan(model, dict(input_ids=ids, labels=ids.clone()), autopar.Cluster.preset("8xH100"),
                        pipeline=False, precision="fp32", zero=0)


def _split(plan, node) -> dict[str, int]:
    return dict(zip((d.name for d in node.dims), plan.assignment[node.name].splits))


def test_long_sequence_attention_is_split_along_the_sequence_and_reported_so():
    plan = _plan()
    attention = [n for n in plan.graph.nodes if n.op == "sdpa"]
    assert len(attention) == 2
    rows = {r.name: r for r in plan.rows}
    pred = predicted_collectives(plan.graph, plan.assignment, autopar.Cluster(**plan.cluster))
    for n in attention:
        parts = _split(plan, n)["l"]
        assert parts > 1, _split(plan, n)
        assert rows[n.name].split.startswith(f"seq/{parts} all-gather K/V"), rows[n.name].split
        for i in (1, 2):  # the key and the value: gathered forward, their gradients scattered back
            into = [it for it in pred.of("edge", n.name) if it.tensors[0].endswith(f"-> {n.name}:{i}")]
            kinds = {(it.phase, it.kind) for it in into}
            assert {("forward", "all-gather"), ("backward", "reduce-scatter")} <= kinds, kinds
    assert "seq/" in plan.report()
    # a row split along the sequence alone is of the "sequence" kind (the picture's colour)
    alone = {r.split_kind for r in plan.rows
             if r.split.startswith("seq/") and "," not in r.split and r.op != "cross_entropy"}
    assert alone == {"sequence"}  # the loss averages over its tokens: a reduction


def test_the_mlp_runs_megatron_sequence_parallelism():
    """Each MLP's first linears split their hidden units over an axis the norm before them
    splits along the sequence (all-gather in), its last linear's partial sums go to a residual
    add split along the sequence on that axis (reduce-scatter out)."""
    plan = _plan()
    graph = plan.graph
    pred = predicted_collectives(graph, plan.assignment, autopar.Cluster(**plan.cluster))
    seq = sequence_dims(graph)
    gathered = scattered = 0
    for n in graph.nodes:
        if n.op != "linear" or not n.module.endswith(("gate_proj", "down_proj")):
            continue
        split = _split(plan, n)
        forward = {it.kind for it in pred.items if it.phase == "forward" and it.where == "edge"
                   and (it.node == n.name or it.tensors[0].startswith(f"{n.name}:"))}
        if n.module.endswith("gate_proj") and split["n"] > 1:
            gathered += "all-gather" in forward
        if n.module.endswith("down_proj") and split["k"] > 1:
            scattered += "reduce-scatter" in forward
    assert gathered == 2 and scattered == 2, (gathered, scattered)
    norms = [n for n in graph.nodes if n.op == "reduce" and "layernorm" in (n.module or "")]
    assert norms and all(any(s > 1 and d.name in seq[n.name] for d, s in zip(n.dims, plan.assignment[n.name].splits))
                         for n in norms)


def test_sequence_dims_follow_the_tokens():
    model, inputs = autopar.zoo.get("gpt", batch=2, seq=8, width=16, heads=2, layers=1, vocab=32)
    graph = autopar.trace(model, inputs)
    seq = sequence_dims(graph)
    by_module = {n.module: seq[n.name] for n in graph.nodes if n.op in ("sdpa", "linear", "embedding")}
    assert by_module["tok"] == {"s"} and by_module["blocks.0.fc1"] == {"s"} and by_module["head"] == {"s"}
    assert [seq[n.name] for n in graph.nodes if n.op == "sdpa"] == [{"l", "m"}]


@functools.lru_cache(maxsize=None)
def _wide(memory_gib: float | None):
    """A 2-layer Llama of width 4096 with 32 heads over 8,192 tokens (batch 1) on 8xH100, planned
    with the device's memory (None) or ``memory_gib`` of it."""
    import transformers as T

    from tests.helpers.hf_models import transformers_quiet

    transformers_quiet()
    cfg = T.LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=16384, num_hidden_layers=2,
                        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=8192,
                        attn_implementation="sdpa")
    with torch.device("meta"):
        model = T.LlamaForCausalLM(cfg).train()
    ids = torch.zeros((1, 8192), dtype=torch.long, device="meta")
    memory = {} if memory_gib is None else {"memory_capacity": memory_gib * 2 ** 30}
    return autopar.plan(model, dict(input_ids=ids, labels=ids.clone()), autopar.Cluster.preset("8xH100"),
                        pipeline=False, precision="fp32", zero=0, recompute=False, **memory)


def _sequence_split_linears(plan) -> int:
    seq = sequence_dims(plan.graph)
    return sum(any(s > 1 and d.name in seq[n.name] for d, s in zip(n.dims, plan.assignment[n.name].splits))
               for n in plan.graph.nodes if n.op == "linear")


@pytest.mark.slow
def test_where_megatrons_plan_does_not_fit_the_plan_that_fits_cuts_activations():
    """With 32 heads, attention splits by heads. With 4 GiB a device (3.1 GiB usable after the
    margin) the Megatron plan (the "expert" baseline) no longer fits; the plan found fits, with
    attention still split by heads, by cutting activations further than the roomy plan does."""
    roomy, tight = _wide(None), _wide(4.0)
    usable = usable_memory(4.0 * 2 ** 30)
    assert tight.baselines["expert"].memory_per_device > usable >= tight.memory_per_device
    assert tight.memory_per_device < roomy.memory_per_device
    assert all(r.split.startswith("h/") for r in tight.rows if r.op == "sdpa")


def test_attention_words_say_whether_keys_are_gathered():
    """Query rows split with the keys arriving split along the sequence: an all-gather of K/V;
    arriving whole: nothing to gather; a causal attention's rows balanced."""
    from autopar.planning.breakdown import keys_arrive_split, split_words
    from tests.helpers.plans import config, sequence_split

    model, inputs = autopar.zoo.get("gpt", batch=2, seq=8, width=16, heads=2, layers=1, vocab=32)
    graph = autopar.trace(model, inputs)
    attention = next(n for n in graph.nodes if n.op == "sdpa")
    gathered = sequence_split(graph, (2,), (0,))
    whole = {n.name: config(n, (2,), {"l": (0,)} if n is attention else {}) for n in graph.nodes}
    assert keys_arrive_split(graph, attention, gathered) and not keys_arrive_split(graph, attention, whole)
    # causal: its rows exchanged for even work (codegen/causal_balance.py), 4 rows per rank
    assert split_words(attention, gathered[attention.name], {"l", "m"}, True) == "seq/2 all-gather K/V, balanced"
    assert split_words(attention, whole[attention.name], {"l", "m"}, False) == "seq/2 K/V whole, balanced"
