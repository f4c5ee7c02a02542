"""``autopar measure --pin``: a plan fixed by its degrees, not the one autopar picks, measured on
one rank. A hierarchical plan of one stage (tensor x data) has no per-node rows: its compute is
predicted from its price's terms (the microbatches' forward and backward and the optimizer
update), checked here against a floor independent of the pricing: torch's FLOP counter's count
of the model's training step, over the devices, at the device's peak rate."""

import json
import os
import subprocess
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import autopar
from autopar.cli.measure import one_process_cluster
from tests.helpers.cli_utils import cli, one_line_error

GPT = "zoo:gpt:layers=2,width=64,heads=4,seq=32,batch=128,vocab=1024"
SIZES = dict(layers=2, width=64, heads=4, seq=32, batch=128, vocab=1024)


@pytest.fixture(scope="module")
def pinned(tmp_path_factory):
    out = tmp_path_factory.mktemp("measure_pinned") / "m.json"
    r = subprocess.run([sys.executable, "-m", "autopar", "measure", GPT, "--devices", "512", "--pin",
                        "tensor=4,pipeline=1", "--zero", "0", "--steps", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    return r.stdout, json.loads(out.read_text())


def training_flops() -> float:
    model, (x, y) = autopar.zoo.get("gpt", **SIZES)
    with FlopCounterMode(display=False) as count:
        model(x, y).backward()
    return float(count.get_total_flops())


def test_a_pinned_single_stage_plan_predicts_its_compute(pinned):
    _, m = pinned
    assert m["devices"] == 512 and m["rank"] == 0
    assert m["measured_compute"] > 0
    device = one_process_cluster(512)
    floor = training_flops() / 512 / device.peak_flops["float32"]  # every device's share at the peak rate
    assert m["predicted_compute"] >= floor, m
    assert m["param_bytes"] > 0 and m["measured_memory"] >= 4 * m["param_bytes"]


def test_the_pinned_plan_is_the_one_measured(pinned):
    # tensor 4: each rank holds about a quarter of the blocks' weights (the embeddings are cut too)
    _, m = pinned
    model, _ = autopar.zoo.get("gpt", **SIZES)
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    assert whole / 8 < m["param_bytes"] < whole / 2, m


@pytest.mark.parametrize("flags,words", [
    (("--pin", "tensor=2", "--plan", "p.json"), "--plan"),
    (("--pin", "tensor=2", "--hierarchical", "off"), "hierarchical"),
    (("--pin", "tensor=2", "--cost-model", "profiled"), "analytic"),
    (("--pin", "tensor=2,zero=1", "--zero", "0"), "disagree"),
    (("--pin", "tensor=2,recompute=full", "--recompute", "none"), "--recompute"),
    (("--pin", "tensors=2"), "pin"),
])
def test_contradicting_pins_are_one_line(flags, words):
    r = cli("measure", "zoo:gpt", "--devices", "8", *flags)
    assert one_line_error(r) and words in r.stderr, r.stderr


@pytest.fixture(scope="module")
def first_stage_whole_heads(tmp_path_factory):
    """Rank 0 of a tensor 8 x pipeline 2 plan whose tensor groups keep the attention's 8 heads whole
    on every rank (the group's fastest layout at this size): the first stage, not the loss's."""
    out = tmp_path_factory.mktemp("measure_tp_pp") / "m.json"
    r = subprocess.run([sys.executable, "-m", "autopar", "measure", "zoo:gpt:layers=2,width=128,heads=8,seq=64,"
                        "batch=64,vocab=512", "--devices", "512", "--pin", "tensor=8,pipeline=2", "--zero", "0",
                        "--rank", "0", "--steps", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())


def test_a_first_stage_holds_its_outputs_and_its_backwards_gradients(first_stage_whole_heads):
    """Its backward holds, beside its saved activations, the output it sent (kept for the backward)
    and the gradient received for it, and the attention's whole gradients of its query, key and
    value: 1.36x the prediction that counted the saved activations only."""
    m = first_stage_whole_heads
    assert m["devices"] == 512 and m["rank"] == 0
    assert m["measured_memory"] >= 4 * m["param_bytes"] > 0
    assert 0.85 <= m["measured_memory"] / m["predicted_memory"] <= 1.15, m


def test_an_error_inside_a_ranks_step_is_one_line():
    """A rank's module that builds but fails in its step (torch's error from deep inside the
    generated program) is reported as one line naming the error, as a failing build is."""
    from autopar.cli.measure_checks import checked
    from autopar.core.errors import AutoparError

    def step():
        torch.zeros(16, 1, 4).expand(32, 1, 4)

    with pytest.raises(AutoparError) as e:
        checked(step)()
    assert "\n" not in str(e.value) and "RuntimeError" in str(e.value) and "expanded size" in str(e.value)
