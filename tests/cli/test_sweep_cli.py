"""``autopar sweep`` and examples/sweep_gpt.py: bad input ends in one line and exit
code 2; the example trains its 8 GPTs on 2 processes and every final loss equals training alone."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autopar.cli import main
from autopar.cli.sweep import build_grid, comparison
from tests.helpers.cli_utils import cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv,message", [
    (["sweep", "zoo:gpt", "--lr", "fast"], "--lr takes comma-separated numbers"),
    (["sweep", "zoo:gpt", "--vary", "width"], "--vary takes key=v1,v2"),
    (["sweep", "zoo:gpt", "--fuse", "0"], "--fuse takes auto, no or a group size"),
    (["sweep", "zoo:gpt", "--nproc", "0"], "--nproc and --steps must be at least 1"),
])
def test_bad_sweeps_end_in_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_the_grid_is_sizes_times_learning_rates():
    models, inputs, names, hparams = build_grid("zoo:mlp:hidden=16", [1e-3, 2e-3], "layers=1,2")
    assert names == ["layers=1 lr=0.001", "layers=1 lr=0.002", "layers=2 lr=0.001", "layers=2 lr=0.002"]
    assert [len(m.layers) for m in models] == [1, 1, 2, 2]
    assert [h["lr"] for h in hparams] == [1e-3, 2e-3, 1e-3, 2e-3]
    assert models[0].layers[0].weight.equal(models[1].layers[0].weight)  # a size's models start alike
    assert models[0] is not models[1]


def test_the_comparison_says_different_when_one_step_differs():
    text, ok = comparison(["a", "b"], [[1.0, 0.5], [2.0, 1.0]], [[1.0, 0.5], [2.0, 1.1]])
    assert not ok and "DIFFERENT" in text
    assert comparison(["a"], [[1.0, 0.5]], [[1.0, 0.5]])[1]


@pytest.mark.slow
def test_sweep_example_matches_each_model_alone():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "sweep_gpt.py"), "--steps", "3"], capture_output=True,
                       text=True, timeout=900, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = re.findall(r"^gpt width=\d+ lr=\S+\s+(\d+\.\d+)\s+(\d+\.\d+)\s+\S+$", r.stdout, flags=re.M)
    assert len(rows) == 8
    assert all(float(a) == pytest.approx(float(b), rel=1e-5) for a, b in rows)
    assert "joint CP-SAT (autopar)" in r.stdout and "equal" in r.stdout


@pytest.mark.slow
def test_the_readme_sweep_command_trains_its_eight_models_like_each_alone(monkeypatch):
    """The README's command: 8 GPTs whose tensors, sent to the ranks as file descriptors, were more
    than a fork server takes in one message ("autopar: error: Invalid argument")."""
    command = "autopar sweep zoo:gpt:layers=2,seq=32,vocab=128 --vary width=32,64"
    assert command in (ROOT / "README.md").read_text()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # in this process (the command's own parser and launcher; its ranks are new processes as from
    # the shell): no interpreter start-up and torch import for the command itself
    r = cli(*command.split()[1:], "--steps", "2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = re.findall(r"^width=\d+ lr=\S+\s+(\d+\.\d+)\s+(\d+\.\d+)\s+\S+$", r.stdout, flags=re.M)
    assert len(rows) == 8 and all(float(a) == pytest.approx(float(b), rel=1e-5) for a, b in rows)
