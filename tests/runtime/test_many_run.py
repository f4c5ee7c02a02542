"""Training many models by one schedule on 2 gloo processes: every model's loss at
every step equals the same model trained alone in one process, whether it was fused with its
siblings, trained data-parallel on a process subgroup, or moved between processes."""

from __future__ import annotations

import functools

import pytest
import torch

import autopar
from autopar.search.schedule import Schedule, Slot, validate
from autopar.cli.training import ADAM_EPS

RTOL = 1e-5


def _assert_equal_losses(got, want):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=RTOL, atol=0, msg=f"model {i}")


def _sweep_models():
    """8 small GPTs: 4 learning rates x 2 widths, all reading one batch."""
    models, names, hparams = [], [], []
    for width in (32, 64):
        for i, lr in enumerate((1e-3, 2e-3, 4e-3, 8e-3)):
            model, inputs = autopar.zoo.get("gpt", batch=8, seq=32, width=width, heads=2, layers=2, vocab=128, seed=i)
            models.append(model)
            names.append(f"w{width}-lr{lr:g}")
            hparams.append({"lr": lr, "eps": ADAM_EPS})
    return models, inputs, names, hparams


@pytest.mark.slow
def test_sweep_of_8_gpts_on_2_processes_equals_each_solo_run():
    """The sweep of examples/sweep_gpt.py, each width's four learning rates fused into one job (the
    analytic model here, to keep the test fast; the example lets the profiled model decide)."""
    models, inputs, names, hparams = _sweep_models()
    many = autopar.compile_many(models, 2, inputs, steps=8, hparams=hparams, names=names, fuse=4,
                                cost_model="analytic")
    assert [len(job.models) for job in many.plan.jobs] == [4, 4]
    validate(many.plan.scheduling_jobs(), many.plan.joint)
    _assert_equal_losses(many.train(timeout=300), many.solo())


def _hand_schedule(plan) -> Schedule:
    """Job 0: unit 0 on rank 0, unit 1 on rank 1 (its state sent over), unit 2 on both (DDP).
    Job 1: unit 0 on rank 1, unit 1 on rank 0 (sent the other way at the same time), unit 2 on both."""
    place = {(0, 0): (0, 1, (0,)), (0, 1): (1, 2, (1,)), (0, 2): (2, 3, (0, 1)),
             (1, 0): (0, 1, (1,)), (1, 1): (1, 2, (0,)), (1, 2): (3, 4, (0, 1))}
    options = {j: {o.devices: i for i, o in enumerate(job.options)} for j, job in enumerate(plan.jobs)}
    slots = []
    for (j, u), (start, end, devices) in place.items():
        slots.append(Slot(j, u, options[j][len(devices)], float(start), float(end), devices))
    return Schedule(slots, 2, "by hand")


@pytest.mark.slow  # each of these starts 2 gloo processes: ~6 s of start-up on 2 cores
def test_moves_and_subgroups_keep_every_model_equal_to_its_solo_run():
    """Two fused MLPs (one job) and a GPT, on the hand schedule: fused training over a subgroup,
    and state moving both ways between the two processes in the same instant."""
    mlps = [autopar.zoo.get("mlp", seed=s)[0] for s in range(2)]
    gpt, gpt_inputs = autopar.zoo.get("gpt", batch=4, seq=16, width=32, heads=2, layers=1, vocab=64)
    mlp_inputs = autopar.zoo.get("mlp")[1]
    many = autopar.compile_many(mlps + [gpt], 2, [mlp_inputs, mlp_inputs, gpt_inputs], steps=6, units=3, fuse=2,
                                cost_model="analytic", hparams=[{"lr": 1e-3, "eps": ADAM_EPS}, {"lr": 3e-3, "eps": ADAM_EPS},
                                                                {"lr": 2e-3, "eps": ADAM_EPS}])
    assert [job.fused for job in many.plan.jobs] == [True, False]
    assert all({o.devices for o in job.options} == {1, 2} for job in many.plan.jobs)
    many.plan.joint = _hand_schedule(many.plan)  # (a job changes its width between units: the runner allows it)
    _assert_equal_losses(many.train(timeout=300), many.solo())


@pytest.mark.slow
def test_any_torch_optimizer_trains_unfused():
    """A callable optimizer (SGD with momentum here) is not fused; each model still trains alone."""
    models = [autopar.zoo.get("mlp", seed=s)[0] for s in range(3)]
    inputs = autopar.zoo.get("mlp")[1]
    many = autopar.compile_many(models, 2, inputs, steps=4, units=2, cost_model="analytic",
                                optimizer=functools.partial(torch.optim.SGD, momentum=0.9),
                                hparams=[{"lr": 0.1}, {"lr": 0.05}, {"lr": 0.02}])
    assert not any(job.fused for job in many.plan.jobs)
    _assert_equal_losses(many.train(timeout=300), many.solo())
