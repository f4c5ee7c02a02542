"""A plan file is checked fully on load: a tampered or mismatched file is refused in one
line naming the first problem, before anything is built or any process is started."""

import json

import pytest

import autopar
from autopar.cli import main
from tests.helpers.cli_utils import cli
from autopar.core.errors import PlanMismatchError
from autopar.planning.plan import Plan

MLP = "zoo:mlp:batch=16,hidden=32"


@pytest.fixture
def run():
    return cli  # the command line in this process (tests/helpers/cli_utils.py)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A real plan of the MLP for 4 devices (mesh (2, 2)), as ``autopar plan --json`` writes it."""
    path = tmp_path_factory.mktemp("plans") / "plan.json"
    assert main(["plan", MLP, "--devices", "4", "--json", str(path)]) == 0
    return json.loads(path.read_text())


def _write(tmp_path, doc, name="tampered.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _one_line_error(r, needle):
    assert r.returncode == 2, r.stdout
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert needle in r.stderr, r.stderr


def test_the_untampered_file_loads(saved, tmp_path, run):
    r = run("show", str(_write(tmp_path, saved)))
    assert r.returncode == 0, r.stderr


def test_a_split_of_3_on_a_2_wide_mesh_axis_is_refused(saved, tmp_path, run):
    doc = json.loads(json.dumps(saved))
    name = next(iter(doc["assignment"]))
    doc["assignment"][name] = {"splits": [3] + [1] * (len(doc["assignment"][name]["splits"]) - 1),
                               "mesh_axes": [[0]] + [[]] * (len(doc["assignment"][name]["splits"]) - 1)}
    r = run("show", str(_write(tmp_path, doc)))
    _one_line_error(r, f"node {name!r} splits dim 0 3 ways on mesh axes [0] of mesh (2, 2), which have 2 devices")


def test_a_mesh_axis_used_twice_or_missing_is_refused(saved, tmp_path, run):
    doc = json.loads(json.dumps(saved))
    name = next(iter(doc["assignment"]))
    n = len(doc["assignment"][name]["splits"])
    doc["assignment"][name] = {"splits": [2, 2] + [1] * (n - 2), "mesh_axes": [[0], [0]] + [[]] * (n - 2)}
    _one_line_error(run("show", str(_write(tmp_path, doc))), "one of them twice")
    doc["assignment"][name] = {"splits": [2] + [1] * (n - 1), "mesh_axes": [[5]] + [[]] * (n - 1)}
    _one_line_error(run("show", str(_write(tmp_path, doc))), "the mesh (2, 2) has axes 0..1")


def test_a_4_device_mesh_on_a_2_device_cluster_is_refused(saved, tmp_path, run):
    doc = json.loads(json.dumps(saved))
    doc["cluster"]["devices"] = 2
    _one_line_error(run("show", str(_write(tmp_path, doc))), "its mesh (2, 2) has 4 devices but its cluster")


def test_a_missing_node_is_refused_by_compile(saved, tmp_path):
    doc = json.loads(json.dumps(saved))
    gone = list(doc["assignment"])[1]
    del doc["assignment"][gone]
    model, inputs = autopar.zoo.get("mlp", batch=16, hidden=32)
    with pytest.raises(PlanMismatchError, match=f"has no config for node {gone!r}"):
        autopar.compile(model, inputs, plan=str(_write(tmp_path, doc)))
    graph = autopar.trace(model, inputs)
    with pytest.raises(PlanMismatchError, match=f"has no config for node {gone!r}"):
        Plan.load(_write(tmp_path, doc), graph=graph)
    assert Plan.load(_write(tmp_path, saved, "ok.json"), graph=graph).assignment.keys() == {
        n.name for n in graph.nodes}


def test_an_inference_plan_does_not_train(tmp_path, run):
    path = tmp_path / "inference.json"
    assert run("plan", MLP, "--devices", "2", "--cluster", "cpu", "--mode", "inference",
               "--json", str(path)).returncode == 0
    r = run("run", MLP, "--nproc", "2", "--plan", str(path))
    _one_line_error(r, "was made for inference, not train")
