"""Mistakes a user makes get one line that says what to do, never a traceback.

Each case here was a traceback (or a late error) before: a model factory that raises, needs
arguments or fails on import; ``x.real`` in a model; a forward that returns no scalar loss; int
inputs into a Linear under ``autopar run``; inputs of another rank or dtype to a compiled
module; ``--json`` into a missing folder (found after planning), ``--png`` onto a folder, ``show``
of a folder; ``--lr nan``; argparse's usage block; ``autopar ... | head`` (BrokenPipeError).
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import autopar
import autopar.cli
from tests.helpers.cli_utils import cli, one_line_error
from tests.helpers.dist_utils import run_threaded

MODELS = '''
import torch, torch.nn as nn

class Vec(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x)

class Dict(Vec):
    def forward(self, x):
        return {"y": self.fc(x)}

class Real(Vec):
    def forward(self, x):
        return self.fc(x).real.sum()

def vec():
    return Vec(), (torch.randn(4, 8),)

def dct():
    return Dict(), (torch.randn(4, 8),)

def real():
    torch.manual_seed(0)
    return Real(), (torch.randn(4, 8),)

def ints():
    return Vec(), (torch.randint(0, 5, (4, 8)),)

def raises():
    raise RuntimeError("no weights here")

def needs(size):
    return Vec(), (torch.randn(4, size),)
'''


@pytest.fixture
def models(tmp_path):
    f = tmp_path / "models.py"
    f.write_text(MODELS)
    return f


@pytest.mark.parametrize("factory, needle", [
    ("raises", "raised RuntimeError: no weights here"),  # was the factory's traceback
    ("needs", "the factory must take no arguments (it has (size))"),  # was TypeError's traceback
])
def test_a_factory_that_raises_or_needs_arguments(models, factory, needle):
    r = cli("plan", f"{models}:{factory}")
    assert one_line_error(r) and needle in r.stderr, r.stderr


def test_a_model_file_that_fails_on_import(tmp_path):
    f = tmp_path / "broken.py"
    f.write_text("import no_such_module_here\n")
    r = cli("trace", f"{f}:make")
    assert one_line_error(r) and "fails on import" in r.stderr and "no_such_module_here" in r.stderr


def test_tensor_real_traces_as_a_replicated_node(models):
    """``x.real`` was a raw tensor in the graph ('Tensor' object has no attribute 'source')."""
    r = cli("plan", f"{models}:real", "--devices", "2")
    assert r.returncode == 0, r.stderr
    assert "no split rule for Tensor.real" in r.stdout


@pytest.mark.parametrize("factory, needle", [
    ("vec", "it returned a tensor of shape (4, 8)"),  # was a rank's RuntimeError from backward
    ("dct", "it returned a dict with keys ['y']"),  # was "rank 0 failed: KeyError: 'loss'"
    ("ints", "does not train on one process either: RuntimeError: mat1 and mat2 must have the same dtype"),
])
def test_run_refuses_a_model_that_cannot_train_before_starting_processes(models, monkeypatch, factory, needle):
    monkeypatch.setattr("autopar.runtime.launch.launch", _no_launch)
    r = cli("run", f"{models}:{factory}")
    assert one_line_error(r) and needle in r.stderr, r.stderr


def _no_launch(*args, **kwargs):
    raise AssertionError("no process may start for a model that cannot train")


def _kinds(rank, world, model, inputs):
    module = autopar.compile(copy.deepcopy(model), world, inputs)
    x = inputs[0]
    found = {}
    for what, first in {"3 dims": x[None], "int64": x.long(), "1 dim": x[0]}.items():
        try:
            module.train_step(first, *inputs[1:])
            found[what] = "accepted"
        except ValueError as e:
            found[what] = str(e)
    return found


def test_a_compiled_module_names_the_input_of_another_rank_or_dtype():
    """Were errors from deep in codegen (mat1 and mat2 dtypes) or a misleading batch size."""
    model, inputs = autopar.zoo.get("mlp", batch=8, hidden=16)
    found = run_threaded(_kinds, 2, model, inputs)[0]
    shape = tuple(inputs[0].shape)
    assert f"has 3 dims (shape {(1, *shape)}); this module was compiled for 2 (shape {shape})" in found["3 dims"]
    assert "is int64; this module was compiled for float32" in found["int64"]
    assert "has 1 dims" in found["1 dim"]


def test_train_step_of_a_forward_returning_a_dict_without_loss():
    class Dict(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return {"y": self.fc(x)}

    module = autopar.compile(Dict(), (torch.randn(2, 4),))  # one device: the model itself
    with pytest.raises(ValueError, match=r"returned a dict with keys \['y'\]"):
        module.train_step(torch.randn(2, 4))


def test_json_into_a_missing_folder_fails_before_planning(tmp_path, monkeypatch):
    """Was a FileNotFoundError traceback after the whole search. We do not create the folder."""
    monkeypatch.setattr(autopar.cli, "_plan", _no_plan)
    r = cli("plan", "zoo:mlp", "--json", str(tmp_path / "nope" / "plan.json"))
    assert one_line_error(r) and "there is no folder" in r.stderr and "mkdir -p" in r.stderr, r.stderr
    assert not (tmp_path / "nope").exists()


def _no_plan(*args, **kwargs):
    raise AssertionError("planned before checking where the files go")


def test_a_picture_onto_a_folder_and_show_of_a_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(autopar.cli, "_plan", _no_plan)
    r = cli("plan", "zoo:mlp", "--png", str(tmp_path))
    assert one_line_error(r) and "is a folder: give a file name" in r.stderr, r.stderr
    r = cli("show", str(tmp_path))  # was IsADirectoryError's traceback
    assert one_line_error(r) and "is a folder" in r.stderr, r.stderr


@pytest.mark.parametrize("lr", ["nan", "inf", "0", "-1", "fast"])
def test_run_lr_is_checked_by_argparse(lr, monkeypatch):
    monkeypatch.setattr("autopar.runtime.launch.launch", _no_launch)
    r = cli("run", "zoo:mlp", "--lr", lr)
    assert one_line_error(r) and "argument --lr" in r.stderr, r.stderr


def test_argparse_errors_are_one_line_too():
    for args in (["plan"], ["plan", "zoo:mlp", "--cost-model", "nope"], ["nope"], ["run", "zoo:mlp", "--steps", "x"]):
        r = cli(*args)
        assert one_line_error(r), (args, r.stderr)


def test_a_closed_pipe_ends_quietly():
    """`autopar trace ... | head -1` was a BrokenPipeError traceback."""
    p = subprocess.Popen([sys.executable, "-m", "autopar", "trace", "zoo:gpt:layers=48"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()  # what head does after its line
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) in (0, 141)
    assert err == ""
