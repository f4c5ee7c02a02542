"""Planning many models: fusion follows the cost model's prices and the memory limit,
shards follow the memory model, and a whole plan's schedules are valid and ordered as claimed."""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np
import pytest
from autopar.cost_models.analytic import AnalyticModel
from autopar.search.schedule import validate

import autopar
from autopar.core.cluster import Cluster
from autopar.core.margin import device_memory_for
from autopar.core.errors import InfeasibleError
from autopar.planning.fusion_choice import choose_fusion, group_sizes
from autopar.planning.many import plan_many
from autopar.planning.shards import NodeProfile, cut_shards, shard_step


class PerOpOverhead(AnalyticModel):
    """The analytic model plus a fixed 1 ms per arithmetic node (views are free): what fusion
    saves, K kernel launches becoming one."""

    def node_cost(self, node, configs, cluster, mode="train"):
        return np.asarray(super().node_cost(node, configs, cluster, mode)) + (1e-3 if node.flops else 0.0)


class BigOpsSlow(AnalyticModel):
    """Each node costs the square of the bytes it touches: fused (bigger) ops lose."""

    def node_cost(self, node, configs, cluster, mode="train"):
        return np.full(len(configs), (node.bytes_read + node.bytes_written) ** 2 * 1e-15)


def _mlps(k):
    models = [autopar.zoo.get("mlp", seed=s)[0] for s in range(k)]
    return models, autopar.zoo.get("mlp")[1]


def test_fusion_is_taken_where_the_cost_model_prices_it_faster():
    models, inputs = _mlps(4)
    cpu = Cluster.preset("cpu", devices=1)
    fused = choose_fusion(models, inputs, cpu, cost_model=PerOpOverhead())
    assert fused.k == 4 and "fused by 4" in fused.why
    assert [p.k for p in fused.prices] == [1, 2, 4]
    one = fused.price(1)
    assert one.total_seconds == pytest.approx(4 * one.group_seconds)
    apart = choose_fusion(models, inputs, cpu, cost_model=BigOpsSlow())
    assert apart.k == 1 and "predicted slower" in apart.why


def test_fusion_stops_at_the_largest_group_that_fits():
    models, inputs = _mlps(4)
    roomy = choose_fusion(models, inputs, Cluster.preset("cpu", devices=1), cost_model=PerOpOverhead())
    two = roomy.price(2).memory
    tight = dataclasses.replace(Cluster.preset("cpu", devices=1), memory_capacity=device_memory_for(two * 1.01))
    choice = choose_fusion(models, inputs, tight, cost_model=PerOpOverhead())
    assert choice.k == 2
    assert not choice.price(4).fits


def test_group_sizes():
    assert group_sizes(1) == [1]
    assert group_sizes(6) == [1, 2, 4, 6]
    assert group_sizes(16) == [1, 2, 4, 8, 16]


def _fewest_parts(sizes, half):
    """Brute force: the fewest contiguous parts, each at most ``half``."""
    n = len(sizes)
    for parts in range(1, n + 1):
        for cuts in itertools.combinations(range(1, n), parts - 1):
            bounds = (0, *cuts, n)
            if all(sum(sizes[a:b]) <= half for a, b in zip(bounds, bounds[1:])):
                return parts
    return None


@pytest.mark.parametrize("seed", range(8))
def test_shards_are_the_fewest_that_each_fit_half_a_device(seed):
    rng = random.Random(seed)
    profiles = [NodeProfile(rng.uniform(0, 1e-3), rng.uniform(0, 2e-3), p := rng.uniform(0, 4e6), 3 * p,
                            rng.uniform(0, 4e6)) for _ in range(rng.randint(3, 9))]
    capacity = 2 * max(p.state + p.activations for p in profiles) * rng.uniform(1.0, 3.0)
    plan = cut_shards(profiles, capacity, host_bandwidth=10e9)
    assert plan.shards[0].start == 0 and plan.shards[-1].stop == len(profiles)
    assert all(a.stop == b.start for a, b in zip(plan.shards, plan.shards[1:]))
    assert all(s.memory <= capacity / 2 * (1 + 1e-12) for s in plan.shards)
    assert plan.count == _fewest_parts([p.state + p.activations for p in profiles], capacity / 2)
    compute = sum(p.forward + p.backward for p in profiles)
    assert compute - 1e-12 <= plan.step_seconds <= plan.serial_seconds + 1e-12
    assert shard_step(plan.shards, 1e30)[0] == pytest.approx(compute)  # free copies: compute alone


def test_a_node_larger_than_half_a_device_cannot_be_sharded():
    with pytest.raises(InfeasibleError, match="more than half a device"):
        cut_shards([NodeProfile(1e-3, 2e-3, 1e6, 3e6, 1e6)], capacity=6e6)


def test_plan_many_shards_the_large_models_and_schedules_everything():
    models, inputs = [], []
    for width, layers in ((64, 2), (128, 4)):
        for s in range(3):
            m, x = autopar.zoo.get("gpt", batch=8, seq=64, width=width, heads=4, layers=layers, vocab=256,
                                   seed=s, device="meta")
            models.append(m)
            inputs.append(x)
    cluster = dataclasses.replace(Cluster(devices=4), memory_capacity=device_memory_for(12e6))
    plan = plan_many(models, inputs, cluster, steps=100, units=4, fuse=False, time_limit=2.0)
    small, large = plan.jobs[0], plan.jobs[-1]
    assert small.shards is None and large.shards is not None and large.shards.count > 1
    assert large.options[0].kind.endswith("shards") and large.options[0].devices == 1
    jobs = plan.scheduling_jobs()
    validate(jobs, plan.lrtf)
    validate(jobs, plan.joint)
    # the bound may equal the optimum: the same durations summed in another order (one ulp apart)
    assert plan.lower_bound <= plan.joint.makespan * (1 + 1e-12) <= plan.lrtf.makespan * (1 + 2e-12)
    text = plan.report()
    for needle in ("lower bound", "Sharded-LRTF", "joint CP-SAT", "shards:", "device  3 |"):
        assert needle in text


def test_models_reading_their_own_data_are_fused_with_stacked_inputs():
    import torch

    from autopar.planning.many import job_module

    models = [autopar.zoo.get("mlp", seed=s)[0] for s in range(3)]
    inputs = [autopar.zoo.get("mlp", seed=10 + s)[1] for s in range(3)]  # a batch per model
    plan = plan_many(models, inputs, Cluster.preset("cpu", devices=2), steps=4, units=2, fuse=3, parallel="ddp",
                     time_limit=1.0)
    (job,) = plan.jobs
    assert job.fused and job.inputs == "stacked"
    module, data = job_module(models, inputs, job)
    want = torch.stack([m(*x) for m, x in zip(models, inputs)])
    torch.testing.assert_close(module(*data), want, rtol=1e-5, atol=1e-6)
