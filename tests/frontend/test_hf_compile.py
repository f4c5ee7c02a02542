"""Hugging Face models compile and train like one device.

GPT-2 (its default config: a key/value cache in its output), BERT, Llama (grouped-query
attention, rotary embeddings, RMSNorm), ViT (class token), ResNet (batch norm) and ConvNeXt
(drop-path), built from their configs, traced by torch.export and compiled from the exported
ATen graph: called with keyword inputs as Hugging Face models are, returning their ModelOutput.
Each on 2 and 4 threaded ranks under autopar's plan, data parallelism and a forced plan that
splits every node it can (heads, hidden units, channels, the vocabulary): the loss at every step, every gradient and every parameter after 3 AdamW steps equal
the single-device run's (``tests/helpers/numerics.py``). Dropout is 0 here (its masks are
tested in ``test_codegen_dropout``)."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

import autopar
from tests.helpers.dist_utils import run_threaded
from tests.helpers.hf_models import NAMES, build
from tests.helpers.numerics import check_module, reference_run
from tests.helpers.plans import split_plan

pytest.importorskip("transformers")  # the test extra: `pip install -e .[test]`
pytestmark = pytest.mark.slow

CASES = [(name, which, world) for world in (2, 4) for name in NAMES
         for which in ("autopar", "data_parallel", "split")]


@functools.lru_cache(maxsize=None)
def _case(name: str, world: int):
    """In float64: the check is of the arithmetic. In float32 the runs agree to rounding (gradients
    to ~1e-6 of their scale), but three AdamW steps at lr 1e-2 through ResNet's batch norms grow
    that to 1e-4 in a few weights; in float64 the same comparison agrees to 1e-13."""
    model, kwargs = build(name, batch=4)
    model = model.double()
    kwargs = {k: v.double() if v.is_floating_point() else v for k, v in kwargs.items()}
    best = autopar.plan(model, kwargs, autopar.Cluster.preset("cpu", devices=world), pipeline=False)
    plans = {"autopar": best, "data_parallel": best.baselines["data_parallel"],
             "split": split_plan(best)}
    return model, kwargs, plans, reference_run(model, (), kwargs=kwargs)


def _rank(rank, world, model, kwargs, plan, ref):
    module = autopar.compile(model, kwargs, plan=plan)
    check_module(rank, module, (), ref, kwargs=kwargs)
    # what the model returns (its ModelOutput); a copy runs, not the shared model (batch-norm statistics)
    assert type(module(**kwargs)) is type(copy.deepcopy(model)(**kwargs))


@pytest.mark.parametrize("name,which,world", CASES, ids=[f"{n}-{w}-{k}" for n, w, k in CASES])
def test_hf_model_trains_like_one_device(name, which, world):
    model, kwargs, plans, ref = _case(name, world)
    run_threaded(_rank, world, model, kwargs, plans[which], ref)


def test_the_forced_plans_split_heads_hidden_and_channels():
    """The forced plan is what the numerics above exercise: check it really cuts the tensor dims."""
    for name in ("gpt2", "llama", "resnet"):
        _, _, plans, _ = _case(name, 2)
        graph, plan = plans["split"].graph, plans["split"]
        cut = {d.name for n in graph.nodes for d, s in zip(n.dims, plan.assignment[n.name].splits) if s > 1
               and n.op in ("linear", "sdpa", "conv", "conv2d", "matmul")}
        assert cut - {"b"}, (name, cut)


def _other_batch(rank, world, model, kwargs, plan):
    module = autopar.compile(model, kwargs, plan=plan)
    smaller = {k: v[:3] for k, v in kwargs.items()}  # 3 over 2 ranks: uneven
    want = copy.deepcopy(model)(**smaller).loss
    torch.testing.assert_close(module(**smaller).loss, want, rtol=1e-9, atol=1e-12)


def test_another_batch_size_runs_like_one_device():
    """The last, smaller batch of an epoch on an exported model: its loss is one device's."""
    model, kwargs, plans, _ = _case("gpt2", 2)
    run_threaded(_other_batch, 2, model, kwargs, plans["data_parallel"])
