"""A flat plan's predicted memory is the larger of its backward's peak and its optimizer update's:
torch's foreach Adam takes the square root of the second moments out of place, one fp32 buffer over
every stepped element, held beside the parameters, gradients and moments (the hierarchical pricing
counts it too, ``step_price``; both through ``training.update_working_set``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import autopar
from autopar.core.margin import device_memory_for


def _mlp():
    """Weights much larger than what a batch of 4 rows saves: the update's peak is the step's."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512))
        x = torch.zeros(4, 512)
    return model, x


def _cluster(devices: int, foreach: bool):
    return dataclasses.replace(autopar.Cluster.preset("cpu", devices=1).with_devices(devices), foreach_update=foreach)


def test_the_flat_plans_memory_counts_the_update_working_set():
    """Independent count on one device, fp32 Adam: each parameter element holds its value, its
    gradient and two moments (4 x 4 bytes), and the update's sqrt buffer of the largest (here the
    only) parameter group, 4 bytes per element; the activations of 4 rows are far less."""
    model, x = _mlp()
    numel = sum(p.numel() for p in model.parameters())
    plan = autopar.plan(model, (x,), _cluster(1, True), baselines=False)
    assert plan.strategy.options.precision == "fp32"
    assert plan.memory_per_device == pytest.approx((4 + 4 + 8) * numel + 4 * numel, rel=1e-12)
    fused = autopar.plan(model, (x,), _cluster(1, False), baselines=False)  # a fused update: no buffer
    assert (4 + 4 + 8) * numel < fused.memory_per_device < (4 + 4 + 8 + 4) * numel


def test_a_plan_whose_update_does_not_fit_is_not_called_fitting():
    """On 2 devices, capacity between what data parallelism's backward holds and what its update
    holds: the plan returned fits its update's peak too (ZeRO-1 steps half the elements per device,
    or the weights split), and costs no less than the plan searched ignoring the update."""
    model, x = _mlp()
    numel = sum(p.numel() for p in model.parameters())
    backward_dp = (4 + 4 + 8) * numel  # plain data parallelism's parameters, gradients, moments
    cap = backward_dp + 2 * numel  # above its backward's peak, below its update's (+4 per element)
    plan = autopar.plan(model, (x,), _cluster(2, True), baselines=False, memory_capacity=device_memory_for(cap))
    assert plan.memory_per_device <= cap * (1 + 1e-12)
    # every weight whole on both devices without ZeRO holds 20 bytes an element through the update
    whole = all(all(k == 1 for k in c.splits) for n, c in plan.assignment.items() if plan.graph.node(n).params)
    assert not (whole and plan.strategy.options.zero == 0)
    free = autopar.plan(model, (x,), _cluster(2, False), baselines=False, memory_capacity=device_memory_for(cap))
    assert plan.cost >= free.cost * (1 - 1e-12)
