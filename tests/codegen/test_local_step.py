"""``module.optimizer`` of an element-wise torch optimizer steps on the parameters' local tensors
(``codegen/local_step.py``): against the same class stepping on the DTensors (DTensor's own
dispatch, the reference), bit for bit, on a plan with sharded and replicated parameters; its
state stays DTensors laid out as their parameters; other optimizers are left as they are."""

from __future__ import annotations

import copy

import torch
from autopar.codegen.local_step import local_stepping
from torch.distributed.tensor import DTensor

import autopar
from autopar.planning.plan import Plan
from tests.helpers.dist_utils import run_threaded
from tests.helpers.training_plans import gpt, make_plans

STEPS = 3


def _train(module, opt, inputs):
    for _ in range(STEPS):
        opt.zero_grad()
        module.train_step(*inputs)
        opt.step()


def _rank(rank, world, doc, built, cls, kwargs):
    model, inputs = copy.deepcopy(built)
    local = autopar.compile(copy.deepcopy(model), inputs, plan=Plan.from_json(doc))
    ref = autopar.compile(copy.deepcopy(model), inputs, plan=Plan.from_json(doc))
    opt = local.optimizer(cls, **kwargs)
    ref_opt = cls(ref.parameters(), **kwargs)  # DTensor's dispatch on every op
    _train(local, opt, inputs)
    _train(ref, ref_opt, inputs)
    params = {n: (p.to_local().clone(), q.to_local().clone(), p.placements)
              for (n, p), (_, q) in zip(local.named_parameters(), ref.named_parameters())}
    states = []
    for p, q in zip(local.parameters(), ref.parameters()):
        for k, v in ref_opt.state[q].items():
            mine = opt.state[p][k]
            states.append((k, type(mine) is type(v), getattr(mine, "placements", None) == getattr(v, "placements", None),
                           torch.equal(mine.to_local() if isinstance(mine, DTensor) else mine,
                                       v.to_local() if isinstance(v, DTensor) else v)))
    sharded = sum(any(not pl.is_replicate() for pl in p.placements) for p in local.parameters())
    return isinstance(opt, cls), type(opt) is not cls, params, states, sharded


def test_an_elementwise_optimizer_steps_on_local_tensors_as_on_dtensors():
    for cls, kwargs in ((torch.optim.AdamW, {"lr": 1e-2, "foreach": True}),
                        (torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9, "foreach": False})):
        for is_cls, swapped, params, states, sharded in run_threaded(_rank, 4, make_plans(4)["hybrid"], gpt(), cls, kwargs):
            assert is_cls and swapped  # an instance of the class asked for, stepping locally
            assert sharded > 0  # the plan shards some parameters: their local tensors are shards
            for name, (mine, ref, _) in params.items():
                assert torch.equal(mine, ref), (cls.__name__, name)
            assert states and all(same_type and same_layout and equal for _, same_type, same_layout, equal in states), \
                [s for s in states if not all(s[1:])][:3]


def test_an_optimizer_that_needs_whole_tensors_is_left_to_dtensor():
    assert local_stepping(torch.optim.LBFGS) is torch.optim.LBFGS
    assert local_stepping(torch.optim.Adafactor) is torch.optim.Adafactor  # factored moments: row and column means
    assert local_stepping(torch.optim.AdamW) is not torch.optim.AdamW
    assert issubclass(local_stepping(torch.optim.AdamW), torch.optim.AdamW)


def _hooks(rank, world, doc, built):
    model, inputs = copy.deepcopy(built)
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])  # AdamW.step now wrapped by torch's hook runner
    module = autopar.compile(model, inputs, plan=Plan.from_json(doc))
    opt = module.optimizer(torch.optim.AdamW, lr=1e-2)
    seen = []
    opt.register_step_pre_hook(lambda o, a, k: seen.append(("pre", type(o.param_groups[0]["params"][0]).__name__)))
    opt.register_step_post_hook(lambda o, a, k: seen.append(("post", type(next(iter(o.state.values()))["exp_avg"]).__name__)))
    for _ in range(2):
        opt.zero_grad()
        module.train_step(*inputs)
        opt.step()
    return seen


def test_step_hooks_run_once_a_step_and_see_dtensors():
    for seen in run_threaded(_hooks, 2, make_plans(2)["dp"], gpt()):
        assert seen == [("pre", "DTensor"), ("post", "DTensor")] * 2
