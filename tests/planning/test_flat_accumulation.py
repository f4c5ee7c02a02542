"""Gradient accumulation on the flat path (planning/accumulation.py): a step of k microbatches is
priced as k forwards and backwards of the microbatch and one gradient sync and optimizer update,
holds one microbatch's activations, and the search weighs it beside ZeRO and recomputation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import autopar
from autopar.core.batch import scale_batch
from autopar.core.blocks import apply_training
from autopar.core.cluster import Cluster
from autopar.core.errors import InfeasibleError
from autopar.core.margin import device_memory_for
from autopar.core.strategy import TrainingOptions
from autopar.cost_models.analytic import AnalyticModel
from autopar.cost_models.tables import build_tables
from autopar.planning.baselines import data_parallel_choice
from autopar.planning.options import FlatOptions, option_sets


@pytest.fixture(scope="module")
def long_gpt():
    """A GPT whose activations, not its weights, fill the memory (sequence 1024, width 128)."""
    model, inputs = autopar.zoo.get("gpt", layers=4, width=128, heads=4, vocab=512, seq=1024, batch=64, device="meta")
    return model, inputs, autopar.trace(model, inputs)


@pytest.mark.parametrize("k", [2, 4])
def test_a_step_of_k_microbatches_is_k_microbatch_passes_and_one_sync(long_gpt, k):
    """Hand count against tables built independently: the microbatch graph priced with the
    gradient sync and optimizer off (the per-microbatch work, run k times) and with them on (their
    difference is paid once), and the k - 1 later microbatches adding their bf16 gradients into
    the held ones (3 passes over every parameter's 2 bytes, replicated: torch's count, at the
    memory's bandwidth x 0.8); memory is the microbatch graph's."""
    model_, _, g = long_gpt
    added = (k - 1) * 3 * 2 * sum(p.numel() for p in model_.parameters())
    cluster = Cluster.preset("8xA100")
    opts = TrainingOptions(precision="bf16", accumulate=k)
    model = AnalyticModel(optimizer="adam")
    flat = FlatOptions(g, cluster, model, "train", "adam", None, [opts])
    micro, tables = flat.tables_for(opts)
    assert {s.shape[0] for s in micro.inputs.values() if s.shape} == {64 // k}
    mg = apply_training(scale_batch(g, k), opts)
    full = build_tables(mg, cluster, model, space="mesh", mode="train", optimizer="adam")
    work = build_tables(mg, cluster, dataclasses.replace(model, sync_scale=0.0, optimizer=None), space="mesh",
                        mode="train", optimizer="adam")
    choice = data_parallel_choice(mg, full)
    once = full.total(choice) - work.total(choice)
    assert once > 0
    added /= cluster.memory_bandwidth * 0.8
    assert tables.total(choice) == pytest.approx(k * work.total(choice) + once + added, rel=1e-12)
    assert tables.total_memory(choice) == pytest.approx(full.total_memory(choice), rel=1e-12)
    plain = build_tables(apply_training(g, opts), cluster, model, space="mesh", mode="train", optimizer="adam")
    whole = data_parallel_choice(g, plain)
    assert tables.total_memory(choice) < plain.total_memory(whole)  # one microbatch's activations


def test_accumulation_is_searched_where_memory_binds_and_the_choice_is_exact(long_gpt):
    """At 70% of the plain plan's memory the automatic choice is the fastest of every option set
    planned on its own (ZeRO x recomputation, and 2 or 4 microbatches a step), and on this
    activation-heavy GPT it is accumulation; without memory pressure no accumulation."""
    model, inputs, g = long_gpt
    kw = dict(graph=g, pipeline=False, baselines=False, hierarchical=False)  # the flat search's own choice
    free = autopar.plan(model, inputs, "8xA100", **kw)
    assert free.strategy.options.accumulate == 1
    device = device_memory_for(0.7 * free.memory_per_device)
    auto = autopar.plan(model, inputs, "8xA100", memory_capacity=device, **kw)
    costs = {}
    for zero in range(4):
        for recompute in (False, True):
            for k in (1, 2, 4):
                if k > 1 and (zero > 1 or recompute):
                    continue
                try:
                    p = autopar.plan(model, inputs, "8xA100", memory_capacity=device, zero=zero,
                                     recompute=recompute, accumulate=k, **kw)
                except InfeasibleError:
                    continue
                assert p.strategy.options.accumulate == k
                costs[(zero, recompute, k)] = p.cost
    assert auto.cost == pytest.approx(min(costs.values()), rel=1e-12)
    assert auto.strategy.options.accumulate > 1
    assert auto.memory_per_device <= 0.7 * free.memory_per_device
    assert "gradient accumulation over" in auto.strategy.options.describe()
    saved = autopar.Plan.from_json(auto.to_json())
    assert saved.strategy.options == auto.strategy.options


def test_accumulation_options_and_their_errors():
    sets = option_sets("fp32", "auto", "auto")
    assert {o.accumulate for o in sets} == {1, 2, 4}
    assert all(o.zero <= 1 and not o.recompute for o in sets if o.accumulate > 1)
    assert {o.accumulate for o in option_sets("fp32", 0, False, accumulate=4)} == {4}
    assert {o.accumulate for o in option_sets("fp32", "auto", "auto", mode="inference")} == {1}
    with pytest.raises(ValueError, match="ZeRO 0 or 1"):
        option_sets("fp32", 3, False, accumulate=2)
    with pytest.raises(ValueError, match="microbatches >= 1"):
        TrainingOptions(accumulate=0)
