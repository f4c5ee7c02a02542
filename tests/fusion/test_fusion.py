"""Fused training equals one-by-one training: K models fused by ``autopar.fuse``,
stepped by ``FusedAdamW`` with a learning rate per model, against each model trained alone by
torch.optim.AdamW, in float64. Every model's loss at every step and every parameter and buffer
after three steps must agree to rtol 1e-5.

Why Adam's eps is 1e-6 here (as in ``autopar.cli.training``): a gradient that is zero in exact
arithmetic (the key bias of attention: softmax ignores a constant added to every key) is
rounding noise of 1e-10 in either run, and with eps = 1e-8 Adam turns that noise into a step of
up to lr in a random direction; at 1e-6 the noise moves nothing. ``atol`` 1e-6 is for entries
that sit at zero (a bias initialised to 0 after a step of noise).
"""

from __future__ import annotations

import copy

import pytest
import torch

import autopar
from autopar.core.errors import TraceError
from autopar.fusion import FusedAdamW, fuse
from autopar.cli.training import ADAM_EPS

STEPS = 3


def _family(name: str, k: int, **sizes):
    """K models of one architecture (different seeds) and one batch, in float64: the equality is of
    the arithmetic; float32 rounding of a grouped conv vs K convs (summation order, thread count)
    would otherwise be amplified by Adam on near-zero gradients."""
    models = [autopar.zoo.get(name, seed=s, **sizes)[0].double() for s in range(k)]
    inputs = tuple(t.double() if t.is_floating_point() else t for t in autopar.zoo.get(name, **sizes)[1])
    return models, inputs


def _solo(model, inputs, lr):
    model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, eps=ADAM_EPS)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = model(*inputs)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model.state_dict()


def _fused(models, inputs, lrs):
    fused = fuse([copy.deepcopy(m) for m in models], inputs)
    opt = FusedAdamW(fused.parameters(), len(models), lr=lrs, eps=ADAM_EPS)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = fused(*inputs)
        loss.sum().backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses).T.tolist(), fused.unfuse()


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("name,sizes", [("mlp", {}), ("cnn", {"image": 16}), ("gpt", {"seq": 32, "width": 64})])
def test_fused_training_equals_one_by_one(name, sizes, k):
    models, inputs = _family(name, k, **sizes)
    lrs = [1e-3 * (1 + i / k) for i in range(k)]
    fused_losses, states = _fused(models, inputs, lrs)
    for i, model in enumerate(models):
        losses, state = _solo(model, inputs, lrs[i])
        torch.testing.assert_close(torch.tensor(fused_losses[i]), torch.tensor(losses), rtol=1e-5, atol=0)
        assert states[i].keys() == state.keys()
        for key, value in state.items():
            torch.testing.assert_close(states[i][key], value, rtol=1e-5, atol=1e-6, msg=f"model {i} {key}")


def test_the_comparison_sees_one_wrong_learning_rate():
    """The check above must fail when one model's run differs: model 1 stepped with model 0's lr."""
    models, inputs = _family("mlp", 2)
    _, states = _fused(models, inputs, [1e-3, 1e-3])
    _, state = _solo(models[1], inputs, 2e-3)
    assert not torch.allclose(states[1]["head.weight"], state["head.weight"], rtol=1e-5, atol=1e-6)


def test_unfuse_gives_each_model_its_own_state_under_its_names():
    models, inputs = _family("cnn", 3, image=8)
    fused = fuse(models, inputs)
    assert fused.k == 3
    for model, state in zip(models, fused.unfuse()):
        assert list(state) == list(model.state_dict())
        for key, value in model.state_dict().items():
            assert torch.equal(state[key], value), key
    copies = [copy.deepcopy(m) for m in models]
    for m in copies:
        for p in m.parameters():
            p.data.zero_()
    fused.load_into(copies)
    assert torch.equal(copies[2].fc.weight, models[2].fc.weight)


def test_eval_mode_uses_each_models_running_statistics():
    models, inputs = _family("cnn", 3, image=8)
    for m in models:  # give the running statistics distinct values first
        m(*inputs)
        m.eval()
    fused = fuse(models, inputs)
    assert not fused.training
    want = torch.stack([m(*inputs) for m in models])
    torch.testing.assert_close(fused(*inputs), want, rtol=1e-5, atol=1e-6)


def test_stacked_inputs_give_each_model_its_own_batch():
    models, (x, labels) = _family("mlp", 3)
    xs = torch.randn(3, *x.shape, dtype=x.dtype)
    ys = torch.randint(0, 16, (3, *labels.shape))
    fused = fuse(models, (x, labels), inputs="stacked")
    want = torch.stack([m(xs[i], ys[i]) for i, m in enumerate(models)])
    torch.testing.assert_close(fused(xs, ys), want, rtol=1e-5, atol=1e-6)


def test_manual_attention_and_other_batch_sizes():
    models, (idx, labels) = _family("gpt", 2, attention="manual", seq=16, width=32, heads=2, vocab=64, layers=1)
    fused = fuse(models, (idx, labels))
    small = (idx[:3], labels[:3])  # shapes stayed symbolic: another batch size runs
    want = torch.stack([m(*small) for m in models])
    torch.testing.assert_close(fused(*small), want, rtol=1e-5, atol=1e-6)


def test_models_that_differ_are_refused_in_one_line():
    a, inputs = autopar.zoo.get("mlp")
    b, _ = autopar.zoo.get("mlp", hidden=64)
    with pytest.raises(TraceError, match="differ"):
        fuse([a, b], inputs)
    c, cnn_inputs = autopar.zoo.get("cnn")
    with pytest.raises(TraceError, match="one architecture"):
        fuse([a, c], inputs)
    with pytest.raises(ValueError, match="twice"):
        fuse([a, a], inputs)
