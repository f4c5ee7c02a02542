"""Casts that take their dtype from another tensor, and calls whose rule drops a tensor argument.

Two patterns of Hugging Face models, written here small: position ids counted with ``cumsum``
over an int mask and cast back with ``type_as`` (RoBERTa), and an embedding scaled by a tensor
made in the hidden state's dtype followed by an RMS norm computed in float32 and cast back with
``type_as`` (Gemma). ``y`` in ``x.type_as(y)`` is read for its dtype only: any layout will do, so
the rule lists it as a metadata read and codegen passes it through untouched. Traced by
torch.export (as Hugging Face models are), compiled on 2 gloo processes under autopar's plan and
a plan that splits every node it can, both train like one device.

A call whose rule does not account for one of its tensor arguments (``x.view_as(y)``: the view
rule reads ``x``) is replicated and listed among the plan's unsupported nodes, not a crash.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import autopar
from autopar.core.ir import METADATA_READS
from tests.helpers.dist_utils import run_gloo, run_threaded
from tests.helpers.numerics import check_module, reference_run
from tests.helpers.plans import split_plan

VOCAB, WIDTH, BATCH, SEQ, PAD = 48, 16, 4, 8, 1


class CountedPositions(nn.Module):
    """Position ids from the non-padding tokens: ``cumsum`` of an int mask, ``type_as`` the mask."""

    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(SEQ + 2, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, input_ids, labels):
        mask = input_ids.ne(PAD).int()
        counted = (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + PAD
        h = self.tokens(input_ids) + self.positions(counted)
        return nn.functional.cross_entropy(self.head(torch.tanh(h)).flatten(0, 1), labels.flatten())


class ScaledEmbedding(nn.Module):
    """An embedding times ``tensor(sqrt(width), dtype=hidden.dtype)``, then an RMS norm in float32
    cast back with ``type_as``."""

    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.scale = nn.Parameter(torch.zeros(WIDTH))
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.head = nn.Linear(2 * WIDTH, VOCAB)

    def norm(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (h * (1.0 + self.scale.float())).type_as(x)

    def forward(self, input_ids, labels):
        hidden = self.tokens(input_ids)
        hidden = hidden * torch.tensor(WIDTH ** 0.5, dtype=hidden.dtype)
        h = torch.relu(self.up(self.norm(hidden)))
        return nn.functional.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


class ViewAs(nn.Module):
    """``x.view_as(y)``: the view rule reads ``x`` only, so the node is replicated."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(WIDTH, WIDTH)
        self.b = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        y = self.a(x)
        flat = self.b(x).flatten(0, 1)
        return (torch.relu(flat.view_as(y)) * y).sum()


def _batch():
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    ids[:, -2:] = PAD  # padding at the end of every row: positions stop counting there
    return {"input_ids": ids, "labels": torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)}


def _plans(model, kwargs, world):
    graph = autopar.trace(model, kwargs, frontend="export")
    best = autopar.plan(model, kwargs, autopar.Cluster.preset("cpu", devices=world), graph=graph, pipeline=False)
    split = split_plan(best)
    return {"autopar": best, "split": split}


def _rank(rank, world, model, kwargs, ref):
    """Each rank traces by torch.export and plans (deterministic), then compiles both plans."""
    for name, plan in _plans(model, kwargs, world).items():
        assert plan.graph.frontend == "export"
        module = autopar.compile(model, kwargs, plan=plan)  # the plan's own graph: no retrace
        check_module(rank, module, (), ref, kwargs=kwargs)
    return sorted(n.name for n in plan.graph.nodes if METADATA_READS in n.attrs)


@pytest.mark.parametrize("cls", [CountedPositions, ScaledEmbedding])
def test_type_as_casts_compile_from_export_and_train_like_one_device(cls):
    torch.manual_seed(0)
    model, kwargs = cls(), _batch()
    casts = run_gloo(_rank, 2, model, kwargs, reference_run(model, (), kwargs=kwargs))
    assert casts[0] == casts[1] and any("type_as" in n for n in casts[0]), casts


def test_type_as_reads_its_other_tensor_for_the_dtype_only():
    """The cast is one elementwise node on its first operand; nothing is replicated for it."""
    graph = autopar.trace(CountedPositions(), _batch(), frontend="export")
    cast = next(n for n in graph.nodes if "type_as" in n.name)
    assert cast.op == "elementwise" and cast.attrs["dtype"] == "int32" and len(cast.inputs) == 1
    assert [s for s, _ in cast.attrs[METADATA_READS]] != [cast.inputs[0].source]
    assert not graph.unsupported


def _view_as_rank(rank, world, model, x, plan, ref):
    module = autopar.compile(copy.deepcopy(model), (x,), plan=plan)
    check_module(rank, module, (x,), ref)


def test_a_rule_that_drops_a_tensor_argument_replicates_the_node_and_lists_it():
    torch.manual_seed(0)
    model, x = ViewAs(), torch.randn(BATCH, SEQ, WIDTH)
    plan = autopar.plan(model, (x,), autopar.Cluster.preset("cpu", devices=2), pipeline=False)
    (name,) = [n for n in plan.unsupported if "view_as" in n]
    assert "view_as" in plan.unsupported[name] and "replicated" in plan.unsupported[name]
    assert name in plan.report()
    split = split_plan(plan)
    ref = reference_run(model, (x,))
    for p in (plan, split):
        run_threaded(_view_as_rank, 2, model, x, p, ref)


def _hf(name: str):
    """A tiny RoBERTa or Gemma from its config: the two families whose compile the casts stopped."""
    import transformers as T

    from tests.helpers.hf_models import transformers_quiet

    transformers_quiet()
    torch.manual_seed(0)
    if name == "roberta":
        cfg = T.RobertaConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                              intermediate_size=32, max_position_embeddings=SEQ + 4, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0)
        model = T.RobertaForMaskedLM(cfg)
    else:
        cfg = T.GemmaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                            max_position_embeddings=SEQ + 4)
        model = T.GemmaForCausalLM(cfg)
    batch = _batch()
    return model.train(), {"input_ids": batch["input_ids"], "labels": batch["input_ids"].clone()}


def _hf_rank(rank, world, model, kwargs, plan, ref):
    check_module(rank, autopar.compile(model, kwargs, plan=plan), (), ref, kwargs=kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["roberta", "gemma"])
def test_roberta_and_gemma_compile_and_train_like_one_device(name):
    pytest.importorskip("transformers")
    model, kwargs = _hf(name)
    plan = autopar.plan(model, kwargs, autopar.Cluster.preset("cpu", devices=2), pipeline=False)
    run_threaded(_hf_rank, 2, model, kwargs, plan, reference_run(model, (), kwargs=kwargs))
    assert plan.graph.frontend == "export" and any(METADATA_READS in n.attrs for n in plan.graph.nodes)
