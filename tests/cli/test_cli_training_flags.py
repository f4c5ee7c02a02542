"""`--recompute` and `--accumulate` on `autopar plan` and `autopar run`: the plan takes what was
asked (on the flat and the hierarchical path), and a value neither takes is one line, exit 2."""

from __future__ import annotations

import pytest

import autopar
from autopar.cli import build_parser, main
from tests.helpers.cli_utils import cli

GPT = "zoo:gpt:layers=4,width=64,heads=4,seq=16,batch=8,vocab=64"


def planned(tmp_path, *flags) -> autopar.Plan:
    path = tmp_path / "plan.json"
    assert main(["plan", GPT, "--cluster", "cpu", "--devices", "4", "--pipeline", "off", "--json", str(path),
                 *flags]) == 0
    return autopar.Plan.load(path)


@pytest.mark.parametrize("flags,recompute,every,accumulate,blocks", [
    (("--recompute", "every-2", "--accumulate", "2"), True, 2, 2, ("blocks.0", "blocks.2")),
    (("--recompute", "full", "--accumulate", "1"), True, 1, 1, ("blocks.0", "blocks.1", "blocks.2", "blocks.3")),
    (("--recompute", "none", "--accumulate", "4"), False, 1, 4, ()),
])
def test_plan_pins_the_recomputation_and_accumulation_asked_for(tmp_path, flags, recompute, every, accumulate,
                                                                 blocks):
    opts = planned(tmp_path, *flags).strategy.options
    assert (opts.recompute, opts.every, opts.accumulate) == (recompute, every, accumulate)
    assert planned(tmp_path, *flags).strategy.recompute == blocks


def test_the_hierarchical_path_takes_them_too(tmp_path):
    """Every 2nd block and 2 microbatches a step: the plan's candidate runs 2 microbatches with
    blocks 0 and 2 checkpointed, and without pipeline stages records them as accumulation."""
    plan = planned(tmp_path, "--hierarchical", "on", "--recompute", "every-2", "--accumulate", "2")
    st = plan.strategy
    assert plan.space == "hierarchical" and plan.microbatches == 2
    assert (st.options.recompute, st.options.every) == (True, 2) and st.recompute == ("blocks.0", "blocks.2")
    assert st.options.accumulate == (2 if st.degrees.p == 1 else 1)


def test_attention_only_recomputation_from_the_command_line(tmp_path):
    path = tmp_path / "plan.json"
    assert main(["plan", "zoo:llama:layers=2,heads=4,attention=manual,batch=4,seq=32", "--devices", "2",
                 "--pipeline", "off", "--recompute", "attention", "--json", str(path)]) == 0
    assert autopar.Plan.load(path).strategy.options.recompute == "attention"


def test_pointwise_recomputation_from_the_command_line(tmp_path):
    path = tmp_path / "plan.json"
    assert main(["plan", "zoo:llama:layers=2,heads=4,batch=4,seq=32", "--devices", "2",
                 "--pipeline", "off", "--recompute", "pointwise", "--json", str(path)]) == 0
    st = autopar.Plan.load(path).strategy
    assert st.options.recompute == "pointwise" and st.recompute == ("blocks.0", "blocks.1")
    assert "pointwise recompute (matmul and attention outputs kept)" in st.options.describe()


def test_run_plans_with_the_flags():
    """`autopar run`'s search (before any process starts) takes the same flags."""
    from autopar.cli import run_setup

    args = build_parser().parse_args(["run", GPT, "--nproc", "2", "--recompute", "every-2", "--accumulate", "2"])
    model, inputs = autopar.zoo.get("gpt", layers=4, width=64, heads=4, seq=16, batch=8, vocab=64)
    opts = run_setup.search(args, model, inputs, {}).strategy.options
    assert (opts.recompute, opts.every, opts.accumulate) == (True, 2, 2)


@pytest.mark.parametrize("flags,message", [
    (("--recompute", "sometimes"), "--recompute 'sometimes': write none, full, attention, pointwise or every-K"),
    (("--recompute", "every-0"), "--recompute 'every-0'"),
    (("--accumulate", "0"), "--accumulate 0: write a count of microbatches >= 1"),
    (("--accumulate", "two"), "--accumulate two: write a count of microbatches >= 1"),
    (("--accumulate", "3"), "does not split into 3 microbatches"),
    (("--accumulate", "3", "--hierarchical", "on"), "does not split into 3 equal microbatches"),
    (("--accumulate", "2", "--zero", "3", "--hierarchical", "on"), "runs with ZeRO 0 or 1"),
])
def test_bad_values_are_one_line_and_exit_2(flags, message):
    r = cli("plan", GPT, "--devices", "4", *flags)
    assert r.returncode == 2, r.stdout
    assert message in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
