"""The zoo's contract: get(name, **sizes) -> (model, inputs); forward(inputs, labels) is a loss."""

import math

import pytest
import torch

import autopar


@pytest.mark.parametrize("name", ["mlp", "cnn", "gpt"])
def test_forward_returns_a_scalar_loss_near_log_classes(name):
    model, inputs = autopar.zoo.get(name)
    loss = model(*inputs)
    assert loss.dim() == 0
    # an untrained classifier's cross entropy sits near log(#classes)
    logits = model(inputs[0])
    classes = logits.shape[-1]
    assert abs(loss.item() - math.log(classes)) < 0.5 * math.log(classes)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_manual_and_sdpa_attention_agree():
    a, inputs = autopar.zoo.get("gpt", attention="sdpa", seed=3)
    b, _ = autopar.zoo.get("gpt", attention="manual", seed=3)
    b.load_state_dict(a.state_dict(), strict=False)
    torch.testing.assert_close(a(*inputs), b(*inputs))


def test_meta_device_allocates_nothing():
    model, inputs = autopar.zoo.get("gpt", layers=48, width=1024, heads=16, device="meta")
    assert all(p.is_meta for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) > 48 * 12 * 1024 * 1024


def test_unknown_name_and_size_are_clear_errors():
    with pytest.raises(ValueError, match="known: mlp"):
        autopar.zoo.get("resnet9000")
    with pytest.raises(ValueError, match="it takes: batch="):
        autopar.zoo.get("gpt", depth=3)


@pytest.mark.parametrize("size", [{"layers": 0}, {"layers": -1}, {"width": 0}, {"batch": 2.5},
                                  {"seq": "64"}, {"heads": True}])
def test_sizes_must_be_positive_ints(size):
    """A zero or negative size built an empty model (layers=-1: no blocks) without a word."""
    with pytest.raises(ValueError, match="must be a positive int"):
        autopar.zoo.get("gpt", **size)
