"""``autopar.compile(model, devices)``: no example inputs, the plan is made at the first call with
its batch (as ``torch.compile`` compiles lazily), the same plan on every rank, then it trains.

Every numerics check is against a single-device run of the unsplit model (``reference_run``),
with the optimizer built on ``module.parameters()`` before the first call, as a training loop
does. The model's plan on 2 devices splits the batch (asserted), so a missing gradient
all-reduce or an optimizer left holding stale parameters fails here.
"""

from __future__ import annotations

import copy

import pytest
import torch

import autopar
from tests.helpers.dist_utils import run_gloo, run_threaded
from tests.helpers.numerics import EPS, LR, STEPS, check_module, loss_of, reference_run

SIZES = dict(batch=512, inputs=64, hidden=256, layers=2, classes=8)  # data parallel wins on 2 cpu devices


def _mlp():
    return autopar.zoo.get("mlp", **SIZES)


@pytest.fixture(scope="module")
def mlp():
    model, inputs = _mlp()
    return model, inputs, reference_run(model, inputs)


def _not_yet(module) -> str:
    with pytest.raises(autopar.NotPlannedYet) as info:
        module.plan  # noqa: B018 - reading it is the test
    return str(info.value)


def _another_batch(module, model, inputs, ref) -> str:
    """A later call with half the batch: refused in one line (returned), or the loss the trained
    single-device model gives on it (then "")."""
    half = tuple(t[: len(t) // 2] for t in inputs)
    try:
        loss = loss_of(module(*half))
    except ValueError as e:
        return str(e)
    trained = copy.deepcopy(model)
    trained.load_state_dict(ref.params)
    torch.testing.assert_close(loss.detach(), loss_of(trained(*half)).detach(), rtol=1e-5, atol=1e-5)
    return ""


def _three_forms(rank, world, model, inputs, ref):
    """compile(model, 2), compile(model, devices=2), compile(model, Cluster): each trains like one device."""
    docs, messages = [], []
    for make in (lambda: autopar.compile(model, world), lambda: autopar.compile(model, devices=world),
                 lambda: autopar.compile(model, autopar.Cluster.preset("cpu", devices=world))):
        module = make()
        messages.append(_not_yet(module))
        check_module(rank, module, inputs, ref)  # the optimizer is built before the first call
        docs.append(module.plan.to_json())
        messages.append(_another_batch(module, model, inputs, ref))
    # module.optimizer before the first call, and train_step as the first call
    module = autopar.compile(model, world)
    opt = module.optimizer(torch.optim.AdamW, lr=LR, eps=EPS)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        losses.append(module.train_step(*inputs))
        opt.step()
    for n, p in module.named_parameters():
        torch.testing.assert_close(p.full_tensor(), ref.params[n], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError) as info:
        autopar.compile(model, world, inputs="local")
    messages.append(str(info.value))
    return docs, messages, [float(x) for x in losses]


def test_compile_with_a_device_count_plans_at_the_first_call_and_trains_like_one_device(mlp):
    model, inputs, ref = mlp
    results = run_gloo(_three_forms, 2, model, inputs, ref)
    docs = [d for r in results for d in r[0]]
    assert all(d["assignment"] == docs[0]["assignment"] for d in docs), "ranks or forms run different plans"
    assert any(max(c["splits"]) > 1 for c in docs[0]["assignment"].values()), "the plan splits nothing"
    assert docs[0]["cluster"]["name"] == "cpu" and docs[0]["cluster"]["devices"] == 2
    for _, messages, losses in results:
        assert all("\n" not in m for m in messages)
        assert all("first call" in m for m in messages[0:6:2])
        assert all(m == "" or "again" in m for m in messages[1:6:2]), messages
        assert "example_inputs" in messages[6]
        torch.testing.assert_close(torch.tensor(losses), torch.stack(ref.losses), rtol=1e-5, atol=1e-6)


def test_compile_on_one_device_plans_at_the_first_call_and_trains_like_the_model(mlp):
    model, inputs, ref = mlp
    module = autopar.compile(model, 1)
    assert isinstance(module, autopar.ParallelModule)
    assert "first call" in _not_yet(module) and "\n" not in _not_yet(module)
    assert [n for n, _ in module.named_parameters()] == list(ref.params)
    opt = torch.optim.AdamW(module.parameters(), lr=LR, eps=EPS)
    for step in range(STEPS):
        opt.zero_grad()
        loss = loss_of(module(*inputs))
        torch.testing.assert_close(loss, ref.losses[step], rtol=1e-5, atol=1e-6)
        loss.backward()
        if step == 0:
            for n, p in module.named_parameters():
                torch.testing.assert_close(p.grad, ref.grads[n], rtol=1e-5, atol=1e-6)
        opt.step()
    for n, p in module.named_parameters():
        torch.testing.assert_close(p.detach(), ref.params[n], rtol=1e-5, atol=1e-5)
    assert module.plan.devices == 1 and module.plan.cluster["name"] == "cpu"
    for n, p in model.named_parameters():  # the user's model is not the one trained
        assert not torch.equal(p, ref.params[n]), n
    fresh = autopar.compile(model, 1)
    fresh(*inputs)
    half = tuple(t[: len(t) // 2] for t in inputs)  # one device runs the model itself: any batch after
    torch.testing.assert_close(fresh(*half), model(*half), rtol=1e-6, atol=1e-6)


def test_one_kind_of_module_for_any_device_count(mlp):
    model, inputs, _ = mlp
    one = autopar.compile(model, 1, inputs)
    assert isinstance(one, autopar.ParallelModule) and one.plan.devices == 1

    def two(rank, world, model, inputs):
        module = autopar.compile(model, world, inputs)  # example inputs: planned now
        return type(module).__name__, module.planned, module.plan.devices

    assert run_threaded(two, 2, model, inputs) == [("ParallelModule", True, 2)] * 2


def _zero(rank, world, model, inputs, path):
    early = autopar.compile(model, world, plan=path, zero=1)
    torch.optim.AdamW(early.parameters())  # built before the plan says ZeRO
    with pytest.raises(ValueError) as info:
        early(*inputs)
    early.optimizer(torch.optim.AdamW).zero_grad()  # built at that call: the plan's own optimizer now
    late = autopar.compile(model, world, plan=path, zero=1)
    late.train_step(*inputs)  # the first call plans; then the plan's own optimizer
    return str(info.value), type(late.optimizer(torch.optim.AdamW)).__name__


def test_an_optimizer_built_before_a_zero_plan_is_refused_in_one_line(mlp, tmp_path):
    model, inputs, _ = mlp
    path = tmp_path / "plan.json"
    autopar.plan(model, inputs, devices=2, baselines=False).save(path)
    for message, late in run_threaded(_zero, 2, model, inputs, str(path)):
        assert "ZeRO-1" in message and "\n" not in message
        assert late == "ShardedOptimizer"


def _load_then_call(rank, world, model, inputs, folder):
    module = autopar.compile(model, world)
    step = autopar.load_checkpoint(folder, module)  # before the first call: into the placeholders
    return step, loss_of(module(*inputs)).detach()


def test_a_checkpoint_loaded_before_the_first_call_is_what_trains(mlp, tmp_path):
    model, inputs, _ = mlp
    saved = copy.deepcopy(model)
    with torch.no_grad():
        for p in saved.parameters():
            p.mul_(0.5)
    autopar.save_checkpoint(tmp_path, saved, step=3)
    want = loss_of(saved(*inputs)).detach()
    assert not torch.allclose(want, loss_of(model(*inputs)).detach())
    for step, loss in run_threaded(_load_then_call, 2, model, inputs, str(tmp_path)):
        assert step == 3
        torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
