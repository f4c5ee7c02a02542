"""The command line as a user runs it: subprocesses, exit codes, one-line errors."""

import json
import subprocess
import sys

import pytest


def run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "autopar", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_trace_prints_the_graph_table():
    r = run("trace", "zoo:mlp")
    assert r.returncode == 0, r.stderr
    assert "linear" in r.stdout and "forward FLOPs" in r.stdout


def test_plan_writes_json_and_picture_and_show_reads_it(tmp_path):
    out, pic = tmp_path / "plan.json", tmp_path / "plan.png"
    r = run("plan", "zoo:gpt:layers=2", "--cluster", "8xA100", "--json", str(out), "--png", str(pic))
    assert r.returncode == 0, r.stderr
    assert "vs data parallel" in r.stdout and "predicted step time" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["format"] == "autopar-plan" and doc["cluster"]["devices"] == 8
    assert pic.read_bytes()[:4] == b"\x89PNG"
    r = run("show", str(out))
    assert r.returncode == 0, r.stderr
    assert "predicted step time" in r.stdout


def test_compare_lists_three_plans():
    r = run("compare", "zoo:gpt:layers=2", "--devices", "4")
    assert r.returncode == 0, r.stderr
    for name in ("data parallel", "expert", "autopar"):
        assert name in r.stdout


@pytest.mark.parametrize("args,message", [
    (("plan", "zoo:resnet"), "unknown zoo model 'resnet'"),
    (("plan", "zoo:mlp", "--cluster", "9xTPU"), "unknown cluster preset"),
    (("plan", "zoo:mlp", "--devices", "0"), "--devices must be at least 1"),
    (("plan", "zoo:mlp:depth=3"), "has no size 'depth'"),
    (("plan", "nofile.py:f"), "no such file"),
    (("plan", "zoo:mlp", "--space", "pase:x"), "unknown space"),
    (("plan", "zoo:mlp", "--memory", "0"), "--memory is GiB per device and must be > 0"),  # was ignored
    (("plan", "zoo:mlp", "--memory", "-2"), "--memory is GiB per device and must be > 0"),
    (("plan", "zoo:gpt:layers=0"), "layers must be a positive int"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    r = run(*args)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_corrupt_plan_file(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text('{"format": "autopar-plan", "schema": 1')
    r = run("show", str(f))
    assert r.returncode == 2 and "invalid JSON" in r.stderr and "Traceback" not in r.stderr


def test_help_explains_every_option():
    r = run("plan", "--help")
    assert r.returncode == 0
    for opt in ("--devices", "--cluster", "--cost-model", "--space", "--search", "--json", "--svg", "--explain"):
        assert opt in r.stdout


FACTORIES = '''
import torch, torch.nn as nn

class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, mask=None):
        y = self.fc(x)
        return {"loss": (y * mask).sum() if mask is not None else y.sum(), "y": y}

def kw():
    return M(), {"x": torch.randn(4, 8), "mask": torch.ones(4, 8)}

def three():
    return M(), (torch.randn(4, 8),), {"mask": torch.ones(4, 8)}
'''


@pytest.mark.slow  # three command-line runs
def test_model_files_may_give_keyword_inputs(tmp_path):
    f = tmp_path / "models.py"
    f.write_text(FACTORIES)
    r = run("trace", f"{f}:kw")
    assert r.returncode == 0, r.stderr
    assert "linear" in r.stdout
    r = run("plan", f"{f}:three", "--devices", "2")
    assert r.returncode == 0, r.stderr
    assert "predicted step time" in r.stdout
    r = run("run", f"{f}:kw", "--nproc", "2")  # compile takes positional inputs for now: one line
    assert r.returncode == 2 and "keyword inputs (x, mask)" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
