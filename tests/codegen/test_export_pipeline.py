"""A model traced with torch.export (a tiny Hugging Face Llama, from a ``LlamaConfig``: nothing
downloaded) trained through codegen's pipeline stages on 2 gloo processes, one stage each, with
the same losses, gradients and parameters as the model trained on one device."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.helpers.dist_utils import run_gloo
from tests.helpers.numerics import ATOL, EPS, LR, PARAM_ATOL, RTOL, STEPS, reference_run
from benchmarks.llama_small import factory
from tests.helpers.plans import two_stage_plan

pytest.importorskip("transformers")

SIZES = dict(layers=2, hidden=32, heads=2, kv_heads=1, mlp=64, vocab=64, seq=8, batch=4)


def _llama():
    return factory(**SIZES)


def _train(rank, world):
    import autopar
    from autopar.codegen.pipeline import pipeline_module

    model, inputs = _llama()
    graph = autopar.trace(model, inputs)
    assert graph.frontend == "export"
    mod = pipeline_module(model, two_stage_plan(graph, 2, "1f1b"), inputs, graph=graph)
    opt = torch.optim.AdamW(mod.parameters(), lr=LR, eps=EPS)
    losses, grads = [], {}
    for step in range(STEPS):
        opt.zero_grad()
        losses.append(float(mod.train_step(*inputs)))
        if step == 0:
            grads = {n: p.grad.detach().numpy().copy() for n, p in mod.named_parameters()}
        opt.step()
    return losses, grads, {n: p.detach().numpy().copy() for n, p in mod.named_parameters()}


@pytest.mark.slow
@pytest.mark.dist
def test_an_exported_models_pipeline_trains_as_the_model_on_one_device():
    ref = reference_run(*_llama())
    ranks = run_gloo(_train, 2)
    owned = [list(r[1]) for r in ranks]
    assert owned[0] and owned[1] and sorted(owned[0] + owned[1]) == sorted(ref.params)  # each parameter in one stage
    for rank, (losses, grads, params) in enumerate(ranks):
        torch.testing.assert_close(torch.tensor(losses), torch.stack(ref.losses), rtol=RTOL, atol=ATOL)
        for n, g in grads.items():
            torch.testing.assert_close(torch.from_numpy(g), ref.grads[n], rtol=RTOL, atol=ATOL,
                                       msg=lambda m, n=n: f"rank {rank} grad {n}: {m}")
        for n, p in params.items():
            torch.testing.assert_close(torch.from_numpy(p), ref.params[n], rtol=RTOL, atol=PARAM_ATOL,
                                       msg=lambda m, n=n: f"rank {rank} param {n}: {m}")


# tiny causal LMs of four Hugging Face families (hidden 64, 2 layers, from their configs)
FAMILIES = ("llama", "gpt2", "mistral", "qwen2")


def _causal_lm(family: str):
    """(``CausalLM`` over the family's model, float64, called with ``input_ids, labels``; inputs):
    batch 4 of 8 tokens. GPT-2's output embedding is untied (a pipeline needs each parameter in
    one stage)."""
    import transformers as T

    from benchmarks.llama_small import CausalLM

    if family == "llama":
        model, inputs = factory(layers=2, hidden=64, heads=4, kv_heads=2, mlp=128, vocab=64, seq=8, batch=4)
        return model.double(), inputs
    if family == "gpt2":
        config = T.GPT2Config(vocab_size=64, n_positions=16, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0,
                              embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False)
    else:
        kind = T.MistralConfig if family == "mistral" else T.Qwen2Config
        config = kind(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                      tie_word_embeddings=False)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    cls = {"gpt2": T.GPT2LMHeadModel, "mistral": T.MistralForCausalLM, "qwen2": T.Qwen2ForCausalLM}[family]
    model = CausalLM(cls(config).train()).double()
    ids = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(1))
    return model, (ids, ids.clone())


def _pinned_train(rank, world, runs):
    import autopar
    from tests.helpers.numerics import check_pipelined

    return [check_pipelined(rank, autopar.compile(model, inputs, plan=plan), inputs, ref)
            for model, inputs, plan, ref in runs]


@pytest.mark.slow
@pytest.mark.dist
def test_exported_models_sharded_stages_run_several_microbatches_like_one_device():
    """Tensor 2 x pipeline 2 on 4 gloo processes, 2 microbatches a step, for each family: the
    causal mask, which the exported graph builds from the batch's size alone, is built at a
    microbatch's rows in each stage (it was built at the whole batch's, and the stage's expand
    failed on a microbatch)."""
    import autopar

    cluster = autopar.Cluster.preset("cpu", devices=4)
    runs = []
    for family in FAMILIES:
        model, inputs = _causal_lm(family)
        plan = autopar.plan(model, inputs, cluster, hierarchical=True, zero=0, recompute=False,
                            pin="tensor=2,pipeline=2,data=1,microbatch=2").baselines["published"]
        assert plan.graph.frontend == "export" and plan.microbatches == 2, family
        assert [s.devices for s in plan.stages] == [2, 2], family
        plan = dataclasses.replace(plan, graph=None, baselines={})  # each rank traces the model, as from a file
        runs.append((model, inputs, plan, reference_run(model, inputs)))
    ranks = run_gloo(_pinned_train, 4, runs)
    for family, (model, *_), owned in zip(FAMILIES, runs, zip(*ranks)):
        assert sorted({n for names in owned for n in names}) == sorted(n for n, _ in model.named_parameters()), family
