"""The command line when the happy path is left: a factory that returns no module, a plan file
cut short, a reader that closes the pipe early, Ctrl-C during ``autopar run``, and the minutes of
the single-process reference run. Each gets one line (and its files), never a traceback."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from autopar import zoo
from autopar.cli import run_setup
from autopar.cli import main
from tests.helpers.cli_utils import cli, one_line_error

MLP = "zoo:mlp:batch=16,hidden=32"

FACTORIES = '''
import torch

def function():
    return (lambda x: x * 2), (torch.randn(4, 8),)

def name():
    return "mlp", (torch.randn(4, 8),)
'''


@pytest.mark.parametrize("factory, what", [("function", "a function"), ("name", "a str")])
@pytest.mark.parametrize("command", ["run", "plan", "trace"])
def test_a_factory_that_returns_no_module(tmp_path, factory, what, command):
    f = tmp_path / "factories.py"
    f.write_text(FACTORIES)
    r = cli(command, f"{f}:{factory}")
    assert one_line_error(r) and what in r.stderr and "torch.nn.Module" in r.stderr, r.stderr


@pytest.fixture(scope="module")
def plan_doc(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    assert cli("plan", MLP, "--devices", "2", "--json", str(path)).returncode == 0
    return path.read_text()


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.99])
def test_a_plan_file_cut_short_says_so_in_a_whole_sentence(tmp_path, plan_doc, keep):
    path = tmp_path / "cut.json"
    path.write_text(plan_doc[:int(len(plan_doc) * keep)])
    r = cli("show", str(path))
    assert one_line_error(r) and "was cut short" in r.stderr and "autopar plan" in r.stderr, r.stderr


def test_invalid_json_says_where(tmp_path, plan_doc):
    path = tmp_path / "bad.json"
    path.write_text(plan_doc.replace('"format"', 'format', 1))
    r = cli("show", str(path))
    assert one_line_error(r) and "line 2, column" in r.stderr, r.stderr


class _ClosedPipe(io.StringIO):
    """stdout after ``| head`` has gone: every write fails."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


def test_plan_writes_its_files_before_printing(tmp_path):
    """``autopar plan ... --json p.json | head -3``: the closed pipe must not cost the file."""
    path, svg = tmp_path / "p.json", tmp_path / "p.svg"
    with contextlib.redirect_stdout(_ClosedPipe()), contextlib.redirect_stderr(io.StringIO()):
        code = main(["plan", MLP, "--devices", "2", "--json", str(path), "--svg", str(svg)])
    assert code == 141
    assert json.loads(path.read_text())["format"] == "autopar-plan" and svg.read_text().startswith("<")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_the_reference_run_shows_one_line_and_progress(monkeypatch):
    """On a terminal: a line that says what runs, redrawn as its steps go, ending in its time."""
    monkeypatch.setattr("autopar.core.progress.is_terminal", lambda stream: True)
    monkeypatch.setenv("COLUMNS", "200")  # a line is cut to the terminal's width: make it wide enough
    model, inputs = zoo.get("mlp", batch=16, hidden=32)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        losses = run_setup.reference_losses(model, inputs, {}, 3, 1e-3, MLP)
    assert len(losses) == 3
    frames = err.getvalue().split("\r")
    assert f"reference: {MLP} on one process" in frames[1] and "0/3" in frames[1]
    assert "3/3" in err.getvalue() and frames[-1].rstrip().endswith(" s") and "done in" in frames[-1]
    assert err.getvalue().count("\n") == 1  # one line on the screen


# The command starts as a terminal's foreground job does, Ctrl-C at Python's default: a test run
# started as a background job of a shell without job control (`make test &` in a script) inherits
# SIGINT ignored, which every child keeps across exec, and Ctrl-C would then reach nothing.
RUN_WITHOUT_REFERENCE = '''
import signal
import sys
signal.signal(signal.SIGINT, signal.default_int_handler)
import autopar.cli.run_setup as rs
from autopar.cli import main
rs.reference_losses = lambda model, inputs, kwargs, steps, lr, spec: [0.0] * steps  # straight to the ranks
sys.exit(main(["run", "zoo:mlp:batch=16,hidden=32", "--steps", "1000000"]))
'''


def _group(pgid: int) -> list[int]:
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                if os.getpgid(int(d)) == pgid and not _zombie(int(d)):
                    found.append(int(d))
    return found


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process group from /proc")
def test_ctrl_c_during_run_is_one_line_and_leaves_nothing(tmp_path):
    """Ctrl-C sends SIGINT to the terminal's whole foreground group: the command, its fork server
    and every rank. One line on stderr (no KeyboardInterrupt traceback from any process, no
    "leaked semaphore objects" from the resource tracker), exit code 130, no process left."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    p = subprocess.Popen([sys.executable, "-c", RUN_WITHOUT_REFERENCE], start_new_session=True, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(_group(p.pid)) < 5 and time.monotonic() < deadline:  # command, tracker, server, 2 ranks
            time.sleep(0.2)
        assert len(_group(p.pid)) >= 5, "the ranks never started"
        time.sleep(2.0)  # the ranks are training
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, err
    assert err.strip().splitlines() == ["autopar: interrupted (Ctrl-C) during `autopar run`; "
                                        "nothing is left running"], err
    deadline = time.monotonic() + 10
    while _group(p.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _group(p.pid)
