"""``autopar measure`` times the communication inside a step apart from its compute.

On torch's fake process group the collectives move nothing but still work on the rank (the fake
all-gather copies its input into every slot) and a reshard slices and copies around them; the
plan prices all of it as communication, so ``measure`` subtracts it from the step. Checked here:
every collective the step runs (seen at the dispatcher, at least as many as torch's
``CommDebugMode`` counts) is inside the time counted as communication, each reshard's forward and
gradient too (counted from the program's ``Reshard`` modules), and the compute measure reports is the step less that time.
"""

from __future__ import annotations

import time

import pytest
import torch
from torch.distributed.tensor.debug import CommDebugMode
from torch.utils._python_dispatch import TorchDispatchMode

import autopar
from autopar.cli.measure import fake_group, measure, one_process_cluster
from autopar.cli.measure_comm import COLLECTIVES, comm_timed

class Inside(TorchDispatchMode):
    """For every collective op the dispatcher runs (c10d's and the functional ones DTensor calls;
    not their waits), whether a ``CommTime`` section was open around it."""

    def __init__(self, comm):
        super().__init__()
        self.comm, self.inside, self.names = comm, [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in ("c10d", "_c10d_functional") and "wait" not in func.__name__:
            self.inside.append(self.comm._depth > 0)
            self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


SIZES = dict(layers=1, width=64, heads=4, seq=16, batch=16, vocab=256)


@pytest.fixture(scope="module")
def tensor_parallel():
    model, inputs = autopar.zoo.get("gpt", **SIZES)
    # a budget that leaves no room for whole weights and their state (1 MiB once the safety margin,
    # 10% + 512 MiB, is off): the plan shards them, with reshards between
    plan = autopar.plan(model, tuple(inputs), one_process_cluster(8), zero=0, pipeline=False, hierarchical=False,
                        memory_capacity=(512 + 1) * 2**20 / 0.9)
    return model, tuple(inputs), plan


def test_every_collective_and_reshard_of_a_step_is_timed_as_communication(tensor_parallel):
    from autopar.codegen.runtime import Reshard
    from autopar.compiler import build_rank_module

    model, inputs, plan = tensor_parallel
    with fake_group(3, plan.devices):
        module = build_rank_module(model, plan, inputs)
        optimizer = module.optimizer(torch.optim.AdamW, lr=1e-3)

        def step():
            module.train_step(*inputs)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step()
        reshards = [m for m in module.program.module.modules() if type(m) is Reshard]  # not the outputs'
        with CommDebugMode() as counted, comm_timed(time.thread_time) as comm, Inside(comm) as seen:
            step()
    assert counted.get_total_counts() > 0
    # every collective torch counts is seen (a functional one also as the c10d op it calls)
    assert len(seen.inside) >= counted.get_total_counts()
    assert all(seen.inside), seen.names  # each one ran while communication was being timed
    assert sum(comm.calls.get(name, 0) for name in COLLECTIVES) >= 1
    # each reshard's forward, and its gradient's move back where one flows
    assert len(reshards) < comm.calls.get("move", 0) <= 2 * len(reshards)
    assert comm.calls.get("launch", 0) >= 1 and comm.calls.get("finish", 0) == 1  # the gradient buckets
    assert comm.seconds > 0


def test_measured_compute_is_the_step_less_its_communication(tensor_parallel):
    model, inputs, plan = tensor_parallel
    m = measure(model, inputs, plan, rank=3, steps=3)
    assert len(m.comm_times) == len(m.step_times) == 3
    assert all(0 < c < t for c, t in zip(m.comm_times, m.step_times))
    less = sorted(t - c for t, c in zip(m.step_times[1:], m.comm_times[1:]))
    assert m.measured_compute == pytest.approx(sum(less) / 2)  # the median of the two steps after the first
