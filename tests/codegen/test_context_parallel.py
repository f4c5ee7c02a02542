"""Context and sequence parallelism train like one device.

The plan is forced: the token embedding splits its sequence dim over every mesh axis and each
later node follows the split it reads (``tests/helpers/plans.follow``), so norms, linears,
rotary embeddings and the loss run on a slice of the positions, and attention runs its query
rows split with the whole keys and values (an all-gather of K/V before each attention, a
reduce-scatter of their gradients after it). Float64, sdpa attention with HF's explicit causal
mask (split by rows with the queries; each rank's rows exchanged for a balanced share of the causal work,
``codegen/causal_balance.py``), grouped-query attention (2 query heads, 1 key/value
head: too few heads to split over 4 devices). On 2 and 4 gloo processes: the loss at every step,
every gradient and every parameter after 3 AdamW steps equal the single-device run's. The
shifted labels end in an ignored position, which the split puts on the last rank alone
(``codegen/counted.py`` keeps the loss the whole batch's mean).

The zoo's gpt (``is_causal=True`` attention: the local call masks by its rows' global positions,
``op_fixes.causal_rows``) under the same sequence split, and under Megatron's tensor parallelism
with sequence parallelism (``tests/helpers/plans.sequence_parallel``), the same way; on 4
processes the sequence goes over one mesh axis and the batch over the other. That these plans
issue the collectives their cost predicts is ``test_codegen_collectives``'s.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

import autopar
from autopar.planning.plan import Plan
from tests.helpers.dist_utils import run_gloo
from tests.helpers.numerics import check_module, check_rank, reference_run
from tests.helpers.plans import follow, sequence_parallel, sequence_split

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

SEQ = 256


def llama(seq: int = SEQ):
    """A 2-layer Llama of width 32 over ``seq`` tokens (batch 1), float64, and its kwargs."""
    import transformers as T

    from tests.helpers.hf_models import transformers_quiet

    transformers_quiet()
    torch.manual_seed(0)
    cfg = T.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=seq,
                        attn_implementation="sdpa")
    model = T.LlamaForCausalLM(cfg).train().double()
    ids = torch.randint(0, 128, (1, seq), generator=torch.Generator().manual_seed(1))
    return model, dict(input_ids=ids, labels=ids.clone())


def sequence_plan(model, kwargs, world: int) -> Plan:
    """autopar's plan for ``world`` devices with every node's sequence split over all mesh axes."""
    best = autopar.plan(model, kwargs, autopar.Cluster.preset("cpu", devices=world), pipeline=False)
    axes = tuple(range(len(best.mesh.shape)))
    forced = follow(best.graph, best.mesh.shape, {"embedding": {"s": axes}})
    return dataclasses.replace(best, assignment=forced, baselines={})


@functools.lru_cache(maxsize=None)
def _case(world: int):
    model, kwargs = llama()
    return model, kwargs, sequence_plan(model, kwargs, world), reference_run(model, (), kwargs=kwargs)


def _rank(rank, world, doc, ref):
    from autopar.codegen.causal_balance import Balance

    calls, run = [], Balance.call
    Balance.call = lambda self, *a: (calls.append(self.parts), run(self, *a))[1]  # this process only
    model, kwargs = llama()
    module = autopar.compile(model, kwargs, plan=Plan.from_json(doc))
    check_module(rank, module, (), ref, kwargs=kwargs)
    # both attentions exchanged their query rows for balanced causal work, at every step
    assert len(calls) >= 2 * 3 and set(calls) == {world}, calls


@pytest.mark.parametrize("world", [2, 4])
def test_the_forced_plan_splits_attention_by_query_rows(world):
    """What the numerics below exercise: every attention's queries split ``world`` ways along
    the sequence, its keys whole (the ``m`` dim cannot be split)."""
    _, _, plan, _ = _case(world)
    attention = [n for n in plan.graph.nodes if n.op == "sdpa"]
    assert len(attention) == 2
    for n in attention:
        splits = dict(zip((d.name for d in n.dims), plan.assignment[n.name].splits))
        assert splits["l"] == world and splits["m"] == 1 and splits["h"] == 1, (n.name, splits)


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_sequence_split_llama_trains_like_one_device(world):
    _, _, plan, ref = _case(world)
    run_gloo(_rank, world, plan.to_json(), ref)


GPT = dict(batch=4, seq=16, width=16, heads=2, layers=2, vocab=32)


def _gpt_rank(rank, world, model, inputs, graph, plans, mesh, ref):
    for assignment in plans.values():
        check_rank(rank, world, model, inputs, graph, assignment, mesh, ref)


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_gpt_with_context_and_sequence_parallelism_trains_like_one_device(world):
    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("gpt", **GPT)
    model = model.double()
    graph = autopar.trace(model, inputs)
    mesh = (2,) if world == 2 else (2, 2)
    last, dp = (len(mesh) - 1,), tuple(range(len(mesh) - 1))
    plans = {"context": sequence_split(graph, mesh, last, dp),
             "sequence_parallel": sequence_parallel(graph, mesh, last, dp)}
    attention = next(n for n in graph.nodes if n.op == "sdpa")
    assert attention.attrs["is_causal"] and plans["context"][attention.name].splits[2] == 2  # l, causal
    run_gloo(_gpt_rank, world, model, inputs, graph, plans, mesh, reference_run(model, inputs))
