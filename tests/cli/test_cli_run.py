"""``autopar run``: the sharded module trained on local gloo processes, as a user runs it.

The per-step losses the command prints for its processes are compared here with a single-process
run of the unsplit model made by the test itself, not with the column the command prints beside.
"""

import re

import pytest

import autopar
from autopar.cli.training import single_process_losses
from tests.helpers.cli_utils import cli


def run(*args):
    """``autopar ARGS`` in this process (``tests/helpers/cli_utils.py``): the ranks of ``run`` are
    gloo processes of their own either way; ``python -m autopar`` itself is tested in test_cli."""
    return cli(*args)

MLP = "zoo:mlp:batch=16,hidden=32"


def _sharded_losses(stdout: str) -> list[float]:
    rows = re.findall(r"^\s*(\d+)\s+(-?\d+\.\d+)\s+(-?\d+\.\d+)\s+\S+$", stdout, flags=re.MULTILINE)
    return [float(r[1]) for r in rows]


def _expected(steps: int, **sizes) -> list[float]:
    model, inputs = autopar.zoo.get("mlp", **(sizes or dict(batch=16, hidden=32)))
    return single_process_losses(model, inputs, steps)


def test_run_trains_like_one_process_and_prints_the_report():
    # a batch large enough that the cpu preset's plan splits it (the small MLP stays replicated,
    # and a replicated plan trains like one process with no gradient sync at all)
    r = run("run", "zoo:mlp:batch=1024,hidden=128", "--nproc", "2", "--steps", "2")
    assert r.returncode == 0, r.stderr
    assert "predicted step time" in r.stdout
    assert re.search(r"^layers\.0\s+linear\s+b/2\s", r.stdout, flags=re.MULTILINE), r.stdout  # batch split
    assert _sharded_losses(r.stdout) == pytest.approx(_expected(2, batch=1024, hidden=128), rel=1e-5)


@pytest.mark.slow
def test_run_uses_a_saved_plan_and_refuses_one_for_another_model(tmp_path):
    path = tmp_path / "plan.json"
    r = run("plan", MLP, "--devices", "2", "--cluster", "cpu", "--json", str(path))
    assert r.returncode == 0, r.stderr
    r = run("run", MLP, "--nproc", "2", "--steps", "2", "--plan", str(path))
    assert r.returncode == 0, r.stderr
    assert _sharded_losses(r.stdout) == pytest.approx(_expected(2), rel=1e-5)
    r = run("run", "zoo:mlp:batch=16,hidden=64", "--nproc", "2", "--plan", str(path))
    assert r.returncode == 2
    assert "another model" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("args, needle", [
    (["zoo:nope"], "unknown zoo model"),
    ([MLP, "--nproc", "0"], "--nproc must be at least 1"),
    ([MLP, "--steps", "0"], "--steps must be at least 1"),
])
def test_run_rejects_bad_input_in_one_line(args, needle):
    r = run("run", *args)
    assert r.returncode == 2
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_progress_shows_on_a_terminal_and_stays_quiet_elsewhere():
    import os
    import pty
    import subprocess
    import sys

    quiet = run("plan", MLP, "--devices", "2")
    assert quiet.returncode == 0 and quiet.stderr == ""
    leader, follower = pty.openpty()
    try:
        r = subprocess.run([sys.executable, "-m", "autopar", "plan", MLP, "--devices", "2"], stdout=subprocess.PIPE,
                           stderr=follower, text=True, timeout=300)
        os.close(follower)
        follower = None
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if follower is not None:
            os.close(follower)
        os.close(leader)
    assert r.returncode == 0
    assert b"tracing MLP ..." in seen and b"planning mlp on 2 devices" in seen
