"""``module.optimizer(AdamW, lr=...)`` without ZeRO: foreach over the DTensor parameters by
default, and the same parameters after 3 steps as torch's AdamW on one device (float64)."""

from __future__ import annotations

import copy

import torch

import autopar
from autopar.planning.plan import Plan
from tests.helpers.dist_utils import run_threaded
from tests.helpers.training_plans import adamw_on_one_device, gpt, make_plans

STEPS, LR = 3, 1e-2


def _rank(rank, world, doc, built):
    model, inputs = copy.deepcopy(built)  # built before the threads: seeded RNG is process-global
    module = autopar.compile(model, inputs, plan=Plan.from_json(doc))
    opt = module.optimizer(torch.optim.AdamW, lr=LR)
    explicit = module.optimizer(torch.optim.AdamW, lr=LR, foreach=False)
    for _ in range(STEPS):
        opt.zero_grad()
        module.train_step(*inputs)
        opt.step()
    params = {n: p.full_tensor() for n, p in module.named_parameters()}
    return opt.defaults["foreach"], explicit.defaults["foreach"], params


def test_optimizer_steps_like_one_device_with_foreach_by_default():
    ref, _ = adamw_on_one_device(STEPS, LR)
    want = dict(ref.named_parameters())
    for foreach, explicit, params in run_threaded(_rank, 2, make_plans(2)["dp"], gpt()):
        assert foreach is True and explicit is False  # the default, and a caller's choice kept
        assert params.keys() == want.keys()
        for name, p in params.items():
            torch.testing.assert_close(p, want[name].detach(), rtol=1e-9, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")
