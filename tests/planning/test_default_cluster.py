"""One default cluster: the command line, ``autopar.plan``, ``autopar.compile`` and
``autopar.compile_many`` price the same cluster when none is named (``autopar.core.resolve``).

Each entry point is run as a user runs it and the cluster its plan records is compared with the
others' (not with the resolver's own answer): a command line that priced a generic 8-device
cluster while ``autopar.plan`` priced the local machine fails here.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

import autopar
from autopar.core.resolve import DEFAULT_PRESET, resolve_cluster
from tests.helpers.cli_utils import cli
from tests.helpers.dist_utils import run_threaded

MLP = "zoo:mlp:batch=8,inputs=8,hidden=16,layers=2,classes=4"


def _mlp():
    return autopar.zoo.get("mlp", batch=8, inputs=8, hidden=16, layers=2, classes=4)


def _as_saved(cluster: dict) -> dict:
    """A plan's cluster as its JSON file holds it (tuples become lists)."""
    return json.loads(json.dumps(cluster))


def _cli_cluster(tmp_path, *flags: str) -> dict:
    path = tmp_path / "plan.json"
    r = cli("plan", MLP, *flags, "--pipeline", "off", "--json", str(path))
    assert r.returncode == 0, r.stderr
    return json.loads(path.read_text())["cluster"]


def test_the_command_line_and_autopar_plan_price_the_same_default_cluster(tmp_path):
    model, inputs = _mlp()
    from_api = _as_saved(autopar.plan(model, inputs, pipeline=False, baselines=False).cluster)
    assert _cli_cluster(tmp_path) == from_api
    assert from_api["name"] == DEFAULT_PRESET


def _compiled_cluster(rank, world, model, inputs):
    return autopar.compile(model, inputs, baselines=False).plan.cluster


def test_every_entry_point_prices_the_same_cluster_for_two_devices(tmp_path, monkeypatch):
    model, inputs = _mlp()
    from_cli = _cli_cluster(tmp_path, "--devices", "2")
    from_plan = _as_saved(autopar.plan(model, inputs, devices=2, pipeline=False, baselines=False).cluster)
    from_count = _as_saved(autopar.plan(model, inputs, 2, pipeline=False, baselines=False).cluster)  # a bare count
    from_compile = [_as_saved(c) for c in run_threaded(_compiled_cluster, 2, model, inputs)]
    seen = []

    def plan_many(models, inputs, cluster, **kwargs):  # what compile_many hands its planner
        seen.append(_as_saved(dataclasses.asdict(cluster)))
        raise autopar.InfeasibleError("stop here: the cluster is what this test reads")

    monkeypatch.setattr("autopar.many.plan_many", plan_many)
    with pytest.raises(autopar.InfeasibleError, match="stop here"):
        autopar.compile_many([model, model], 2, inputs)
    assert from_cli == from_plan == from_count == from_compile[0] == from_compile[1] == seen[0]
    assert from_plan["devices"] == 2 and from_plan["name"] == DEFAULT_PRESET


def test_one_device_compile_prices_the_default_cluster():
    model, inputs = _mlp()
    module = autopar.compile(model, 1, inputs, baselines=False)
    assert module.plan.cluster == autopar.plan(model, inputs, devices=1, baselines=False).cluster
    assert module.plan.cluster["name"] == DEFAULT_PRESET


def test_the_resolver_refuses_what_disagrees_in_one_line():
    with pytest.raises(ValueError, match="has 8 devices, not devices=2"):
        resolve_cluster(autopar.Cluster.preset("8xA100"), 2)
    with pytest.raises(ValueError, match="pass one of them"):
        resolve_cluster(4, 2)
    with pytest.raises(ValueError, match="positive device count"):
        resolve_cluster(None, 0)
    with pytest.raises(ValueError, match="unknown cluster preset"):
        resolve_cluster("9xTPU")
    assert resolve_cluster("8xA100").devices == 8  # a preset keeps its own count
    assert resolve_cluster("8xA100", 4).devices == 4
