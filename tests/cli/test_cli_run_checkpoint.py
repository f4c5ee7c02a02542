"""``autopar run``: the memory check before starting, and --checkpoint / --resume.

The memory case runs in this process with the machine's available memory monkeypatched below the
plan's prediction; the launch is replaced so that nothing starts. The resume case runs the command
twice as a user would: 6 steps straight with --checkpoint (saving after steps 4 and 6), then, with
step 6's checkpoint removed, 2 more with --resume from step 4; the resumed run's per-step losses
must be the straight run's last two.
"""

from __future__ import annotations

import re
import shutil

import pytest

from autopar.cli import run_setup
from autopar.planning.plan import Plan
from tests.helpers.cli_utils import cli, one_line_error

MLP = "zoo:mlp:batch=16,hidden=32"
GPT = "zoo:gpt:layers=1,width=128,heads=4,seq=16,batch=2,vocab=64"


class Launched(Exception):
    pass


def _launch(*args, **kwargs):
    raise Launched


def test_run_refuses_a_plan_over_the_available_memory(monkeypatch):
    monkeypatch.setattr(run_setup, "available_memory", lambda: 1000)  # bytes
    monkeypatch.setattr("autopar.runtime.launch.launch", _launch)
    seen = {}
    real = run_setup.check_memory

    def spy(plan, processes, ignore=False):
        seen["per"] = plan.memory_per_device
        return real(plan, processes, ignore)

    monkeypatch.setattr(run_setup, "check_memory", spy)
    r = cli("run", MLP, "--nproc", "2")
    assert one_line_error(r), r.stderr
    assert seen["per"] > 1000 / 2  # the prediction did exceed what we said was there
    from autopar.report.format import fmt_bytes

    assert f"{fmt_bytes(seen['per'])} per process x 2 processes = {fmt_bytes(2 * seen['per'])}" in r.stderr
    assert "the local machine has 1000 B available" in r.stderr and "--ignore-memory" in r.stderr
    with pytest.raises(Launched):  # and it goes on when told to
        cli("run", MLP, "--nproc", "2", "--ignore-memory")


def test_the_memory_check_passes_when_it_fits(monkeypatch):
    monkeypatch.setattr(run_setup, "available_memory", lambda: 2**40)
    monkeypatch.setattr("autopar.runtime.launch.launch", _launch)
    with pytest.raises(Launched):
        cli("run", MLP, "--nproc", "2")


def test_available_memory_reads_this_machine():
    have = run_setup.available_memory()
    assert have is None or 2**20 < have < 2**50


def test_a_saved_plan_is_checked_as_well(monkeypatch, tmp_path):
    path = tmp_path / "plan.json"
    assert cli("plan", MLP, "--devices", "2", "--cluster", "cpu", "--json", str(path)).returncode == 0
    monkeypatch.setattr(run_setup, "available_memory", lambda: int(Plan.load(path).memory_per_device))
    monkeypatch.setattr("autopar.runtime.launch.launch", _launch)
    r = cli("run", MLP, "--nproc", "2", "--plan", str(path))  # fits one process, not two
    assert one_line_error(r) and "x 2 processes" in r.stderr, r.stderr


@pytest.mark.parametrize("args, needle", [
    (["--resume"], "--resume needs --checkpoint DIR"),
    (["--checkpoint-every", "2"], "--checkpoint-every needs --checkpoint DIR"),
    (["--checkpoint", "{tmp}", "--checkpoint-every", "0"], "--checkpoint-every must be at least 1"),
    (["--checkpoint", "{tmp}", "--resume"], "no checkpoint in"),
])
def test_checkpoint_options_are_checked_before_starting(args, needle, tmp_path, monkeypatch):
    monkeypatch.setattr("autopar.runtime.launch.launch", _launch)
    r = cli("run", MLP, *[a.format(tmp=tmp_path) for a in args])
    assert one_line_error(r) and needle in r.stderr, r.stderr


def _run(*args):
    r = cli("run", GPT, "--nproc", "2", *args)  # in this process; the ranks are its gloo processes
    assert r.returncode == 0, r.stderr
    rows = re.findall(r"^\s*(\d+)\s+(-?\d+\.\d+)\s+(-?\d+\.\d+)\s+\S+$", r.stdout, flags=re.MULTILINE)
    return r.stdout, {int(k): float(a) for k, a, _ in rows}


def _megatron_plan(path) -> str:
    """The GPT's expert plan (Megatron: its MLP and attention tensor-parallel), saved: autopar's
    own plan for so small a model on the cpu preset replicates it, and the checkpoint must carry
    sharded parameters."""
    import autopar
    from autopar.cli.model_spec import load

    model, inputs, _ = load(GPT)
    plan = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=2), pipeline=False)
    expert = plan.baselines["expert"]
    assert max(expert.assignment["blocks_0_fc1"].splits) == 2  # a sharded parameter goes through the checkpoint
    expert.save(str(path))
    return str(path)


@pytest.mark.slow  # two runs of 2 processes
def test_resume_prints_the_losses_of_a_straight_run(tmp_path):
    from autopar.runtime.checkpoint import latest

    plan = _megatron_plan(tmp_path / "plan.json")
    ckpt = str(tmp_path / "ckpt")
    out, straight = _run("--steps", "6", "--plan", plan, "--checkpoint", ckpt, "--checkpoint-every", "4")
    assert "steps 4, 6 (newest 6)" in out  # every 4 steps and after the last
    shutil.rmtree(latest(ckpt))  # step 4 is now the newest: the run resumes in the middle of the straight one
    out, resumed = _run("--steps", "2", "--plan", plan, "--checkpoint", ckpt, "--resume")
    assert "resumed from step 4" in out
    assert sorted(straight) == [0, 1, 2, 3, 4, 5] and sorted(resumed) == [4, 5]
    assert resumed == pytest.approx({k: straight[k] for k in resumed}, rel=1e-6)
