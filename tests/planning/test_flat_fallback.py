"""Where memory binds the flat exact search, the hierarchical space (any count of microbatches,
pipelines) may hold the only fitting plan, or a faster one: ``autopar.plan`` returns the better of
the two paths' plans and its search line says what each found (planning/fallback.py); the flat
search asked for by name still raises InfeasibleError in one line."""

from __future__ import annotations

import pytest

import autopar
from autopar.core.errors import InfeasibleError
from autopar.core.margin import device_memory_for

CLUSTER = "4xA100"


@pytest.fixture(scope="module")
def gpt():
    """A GPT whose activations fill the memory (batch 64 of 64 tokens, width 64), and the memory
    its fastest flat plan takes when memory is no object."""
    model, inputs = autopar.zoo.get("gpt", layers=2, width=64, heads=4, seq=64, batch=64, vocab=256, device="meta")
    graph = autopar.trace(model, inputs)
    free = autopar.plan(model, inputs, CLUSTER, graph=graph, baselines=False, hierarchical=False)
    return model, inputs, graph, free.memory_per_device


def _plan(gpt, share, **kw):
    model, inputs, graph, free = gpt
    return autopar.plan(model, inputs, CLUSTER, graph=graph, baselines=False,
                        memory_capacity=device_memory_for(share * free), **kw)


def test_where_no_flat_plan_fits_the_hierarchical_plan_is_returned(gpt):
    """At 12% of the free plan's memory the flat space (ZeRO, recomputation, 1-4 microbatches)
    holds nothing that fits; the hierarchical space does (16 microbatches of 1 row per device)."""
    with pytest.raises(InfeasibleError) as e:  # the flat search asked for by name: no fallback
        _plan(gpt, 0.12, hierarchical=False)
    assert "\n" not in str(e.value) and "add devices or memory" in str(e.value)
    forced = _plan(gpt, 0.12, hierarchical=True)
    plan = _plan(gpt, 0.12)
    assert plan.search.name == "hierarchical"
    assert plan.cost == pytest.approx(forced.cost, rel=1e-12)
    assert plan.memory_per_device <= 0.12 * gpt[3] * (1 + 1e-9)  # fits what a plan may use
    line = plan.search.describe()
    assert "in the flat exact search's space no plan of GPT fits" in line
    assert "the hierarchical space (any count of microbatches, pipelines) holds this one" in line


def test_where_memory_binds_the_automatic_plan_is_no_slower_than_either_path(gpt):
    """At 18% the flat space's best fitting plan accumulates 4 microbatches; the hierarchical
    space's runs more than 4 and is faster: the automatic plan is no slower than either search
    run on its own, and its search line names both."""
    flat = _plan(gpt, 0.18, hierarchical=False)
    hier = _plan(gpt, 0.18, hierarchical=True)
    assert hier.microbatches > 4 and hier.cost < flat.cost  # the case this test is about
    plan = _plan(gpt, 0.18)
    assert plan.cost <= hier.cost * (1 + 1e-12) and plan.cost <= flat.cost * (1 + 1e-12)
    assert plan.memory_per_device <= hier.memory_per_device * (1 + 1e-12)
    line = plan.search.describe()
    assert "memory binds the flat exact search, whose best fitting plan is" in line
    assert "is faster" in line
