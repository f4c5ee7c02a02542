"""Fuzzing the command line (hypothesis): whatever the arguments or the plan file, a rejected input
is exit code 2 and exactly one line on stderr, never a traceback.

The CLI runs in this process (tests/helpers/cli_utils.py); ``autopar run`` stops where it would start its
processes (the launch is replaced), so every example costs a parse, a trace or a small search.
Accepted inputs may print anything; only the way a rejection looks is asserted here.
"""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.helpers.cli_utils import cli, one_line_error

MODEL = "zoo:mlp:batch=4,hidden=8"
MODELS = [MODEL, "zoo:mlp", "zoo:nope", "zoo:mlp:depth=1", "zoo:mlp:batch=-1", "zoo:mlp:batch", "zoo:", "",
          "x.py:f", "nofile.py", "zoo:gpt:layers=1,width=16,heads=2,seq=4,batch=2,vocab=8"]
NUMBERS = ["0", "1", "2", "3", "-1", "nan", "inf", "-inf", "1e-9", "1e9", "x", "", "2.5"]
OPTIONS = {
    "--devices": ["0", "1", "2", "3", "-1", "x", "", "2.5"],
    "--cluster": ["cpu", "8xA100", "9xTPU", "", "2x2xH100", "1x1x1"],
    "--memory": NUMBERS,
    "--cost-model": ["analytic", "pase", "nope", ""],
    "--space": ["mesh", "pase", "pase:x", ""],
    "--search": ["auto", "dp", "nope"],
    "--mode": ["train", "inference", "x"],
    "--pipeline": ["auto", "on", "off", "x"],
    "--precision": ["fp32", "bf16", "fp8"],
    "--zero": ["auto", "0", "3", "4"],
    "--pin": ["tensor=2", "tensor=x", "nope", "tensor=2,pipeline=2", ""],
    "--nproc": ["0", "1", "2", "-1", "x"],
    "--steps": ["0", "1", "-2", "x"],
    "--lr": NUMBERS,
    "--timeout": NUMBERS,
    "--checkpoint-every": ["0", "1", "x"],
}
FLAGS = ["--explain", "--published", "--resume", "--ignore-memory", "--help-me", "-x"]
COMMANDS = ["trace", "plan", "compare", "show", "run", "nope"]


class Launched(Exception):
    pass


def _launch(*args, **kwargs):
    raise Launched


def _check(r) -> None:
    if r.returncode not in (0, None):  # argparse's --help exits 0 (None in some versions)
        assert one_line_error(r), f"exit {r.returncode}, stderr:\n{r.stderr}"
    assert "Traceback" not in r.stderr


def _call(*args):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("autopar.runtime.launch.launch", _launch)
        try:
            return cli(*args)
        except Launched:  # accepted: `run` got as far as starting its processes
            return None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(COMMANDS), model=st.sampled_from(MODELS),
       options=st.lists(st.sampled_from(sorted(OPTIONS)).flatmap(
           lambda k: st.tuples(st.just(k), st.sampled_from(OPTIONS[k]))), max_size=3),
       flags=st.lists(st.sampled_from(FLAGS), max_size=1))
def test_any_arguments(command, model, options, flags):
    argv = [command, model] + [x for kv in options for x in kv] + flags
    r = _call(*argv)
    if r is not None:
        _check(r)


@pytest.fixture(scope="module")
def plan_doc(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    r = cli("plan", MODEL, "--devices", "2", "--cluster", "cpu", "--json", str(path))
    assert r.returncode == 0, r.stderr
    return json.loads(path.read_text())


GARBAGE = st.sampled_from([None, "x", "", [], {}, 3.5, -1, 0, True, [1, 2], {"a": 1}, "nan", float("inf")])


def _mutate(doc: dict, data) -> dict:
    doc = copy.deepcopy(doc)
    kind = data.draw(st.sampled_from(["drop node", "split", "mesh", "mode", "field", "drop field", "axes"]))
    nodes = sorted(doc["assignment"])
    if kind == "drop node":
        del doc["assignment"][data.draw(st.sampled_from(nodes))]
    elif kind == "split":
        config = doc["assignment"][data.draw(st.sampled_from(nodes))]
        i = data.draw(st.integers(0, len(config["splits"]) - 1))
        config["splits"][i] = data.draw(st.one_of(st.integers(-2, 9), GARBAGE))
    elif kind == "axes":
        config = doc["assignment"][data.draw(st.sampled_from(nodes))]
        i = data.draw(st.integers(0, len(config["mesh_axes"]) - 1))
        config["mesh_axes"][i] = data.draw(st.one_of(st.lists(st.integers(-1, 3), max_size=2), GARBAGE))
    elif kind == "mesh":
        doc["mesh"] = data.draw(st.one_of(
            st.fixed_dictionaries({"shape": st.lists(st.integers(0, 4), max_size=3),
                                   "level": st.lists(st.integers(0, 1), max_size=3)}), GARBAGE))
    elif kind == "mode":
        doc["mode"] = data.draw(st.one_of(st.sampled_from(["inference", "train", "TRAIN"]), GARBAGE))
    elif kind == "field":
        doc[data.draw(st.sampled_from(sorted(doc)))] = data.draw(GARBAGE)
    else:
        del doc[data.draw(st.sampled_from(sorted(doc)))]
    return doc


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_plan_file(plan_doc, tmp_path_factory, data):
    path = tmp_path_factory.mktemp("mutated") / "plan.json"
    path.write_text(json.dumps(_mutate(plan_doc, data)))
    _check(cli("show", str(path)))
    r = _call("run", MODEL, "--nproc", "2", "--plan", str(path))
    if r is not None:
        _check(r)


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d["assignment"][sorted(d["assignment"])[0]].update(splits=[3, 1, 1], mesh_axes=[[0], [], []]),
     "3 ways on mesh axes [0] of mesh (2,), which have 2 devices"),  # was accepted silently
    (lambda d: d.update(mesh={"shape": [4], "level": [0]}), "its mesh (4,) has 4 devices but its cluster"),
    (lambda d: d.update(cluster=None), "'cluster' must be a dict"),  # was an AttributeError traceback
    (lambda d: d.update(microbatches=float("inf")), "microbatches must be a positive int"),  # OverflowError
])
def test_tampered_plan_files_are_one_line(plan_doc, tmp_path, edit, needle):
    doc = copy.deepcopy(plan_doc)
    edit(doc)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    r = cli("show", str(path))
    assert one_line_error(r) and needle in r.stderr, r.stderr


def test_a_plan_file_priced_at_zero_shows_its_baselines_as_not_comparable(plan_doc, tmp_path):
    # hypothesis found it: "cost": 0 made `autopar show` divide by it (ZeroDivisionError traceback)
    doc = copy.deepcopy(plan_doc)
    assert doc["baselines"]  # the fixture's plan compares itself with them
    doc["cost"] = 0
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    r = cli("show", str(path))
    assert r.returncode == 0, r.stderr
    assert "not comparable" in r.stdout
