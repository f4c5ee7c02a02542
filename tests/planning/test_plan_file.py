"""Plans round-trip through JSON, and a file for another model/cluster/schema is refused."""

import json

import pytest

from autopar.core.errors import PlanMismatchError
from autopar.core.fingerprint import fingerprint
from autopar.core.ir import Dim, Graph, Node, Operand, TensorSpec
from autopar.core.tables import Config, Mesh
from autopar.planning.plan import Plan, SearchInfo, Stage


def tiny_graph(width=8):
    x = TensorSpec((4, width), "float32", (("b",), ("k",)))
    w = TensorSpec((16, width), "float32", (("n",), ("k",)))
    y = TensorSpec((4, 16), "float32", (("b",), ("n",)))
    node = Node("fc", "linear", "torch.nn.Linear", "fc",
                (Dim("b", 4), Dim("n", 16), Dim("k", width, reduction=True)),
                (Operand("input:x", 0, x),), (Operand("param:fc.weight", 0, w),), (y,))
    return Graph([node], {"x": TensorSpec((4, width), "float32", ((), ()))}, [("fc", 0)], "tiny")


def make_plan(graph):
    base = Plan("tiny", fingerprint(graph), {"name": "flat", "devices": 4}, Mesh((2, 2), (0, 0)),
                "analytic", "mesh", "train", {"fc": Config((4, 1, 1), ((0, 1), (), ()))}, 2.0, "s",
                100.0, SearchInfo("dp", 0.1))
    return Plan("tiny", fingerprint(graph), {"name": "flat", "devices": 4}, Mesh((2, 2), (0, 0)),
                "analytic", "mesh", "train", {"fc": Config((2, 2, 1), ((0,), (1,), ()))}, 1.5, "s",
                50.0, SearchInfo("dp", 0.2, 0.0), stages=[Stage(["fc"], 4, 1.5)],
                unsupported={"x": "why"}, baselines={"data_parallel": base})


def test_roundtrip_keeps_everything(tmp_path):
    g = tiny_graph()
    plan = make_plan(g)
    plan.save(tmp_path / "p.json")
    back = Plan.load(tmp_path / "p.json", graph=g, cluster={"name": "flat", "devices": 4})
    assert back == plan
    assert back.baselines["data_parallel"].assignment["fc"].mesh_axes == ((0, 1), (), ())
    assert back.speedup_over("data_parallel") == pytest.approx(2.0 / 1.5)
    with pytest.raises(ValueError, match="no baseline 'expert'; it has: data_parallel"):
        back.speedup_over("expert")  # was a bare KeyError
    back.cost = 0.0  # a hand-edited plan file priced at nothing: inf, not a ZeroDivisionError
    assert back.speedup_over("data_parallel") == float("inf")


def test_plan_for_another_model_is_refused(tmp_path):
    make_plan(tiny_graph()).save(tmp_path / "p.json")
    other = tiny_graph(width=12)
    assert fingerprint(other) != fingerprint(tiny_graph())
    with pytest.raises(PlanMismatchError, match="another model"):
        Plan.load(tmp_path / "p.json", graph=other)


def test_plan_for_another_cluster_is_refused(tmp_path):
    make_plan(tiny_graph()).save(tmp_path / "p.json")
    with pytest.raises(PlanMismatchError, match="re-plan for this cluster"):
        Plan.load(tmp_path / "p.json", cluster={"name": "flat", "devices": 8})


@pytest.mark.parametrize("text,match", [
    ("{not json", "invalid JSON"),
    ('{"format": "something"}', "not an autopar plan"),
    ('{"format": "autopar-plan", "schema": 99}', "schema 99"),
    ('{"format": "autopar-plan", "schema": 1, "model_name": "x"}', "corrupt plan file"),
])
def test_bad_files_give_one_line_errors(tmp_path, text, match):
    f = tmp_path / "p.json"
    f.write_text(text)
    with pytest.raises(PlanMismatchError, match=match) as e:
        Plan.load(f)
    assert "\n" not in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(PlanMismatchError, match="no plan file"):
        Plan.load(tmp_path / "nope.json")


def test_saved_file_is_versioned_json(tmp_path):
    make_plan(tiny_graph()).save(tmp_path / "p.json")
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["format"] == "autopar-plan" and doc["schema"] == 1 and len(doc["fingerprint"]) == 16


def test_cluster_fields_read_back_as_written_and_old_files_still_match(tmp_path):
    import dataclasses

    from autopar.core.cluster import Cluster

    fitted = Cluster(devices=4, backend="gloo", kind_factors=(("all-gather", 0.5, 1.2),))
    plan = dataclasses.replace(make_plan(tiny_graph()), cluster=dataclasses.asdict(fitted))
    plan.save(tmp_path / "p.json")
    assert Plan.load(tmp_path / "p.json", cluster=fitted).cluster["kind_factors"] == [["all-gather", 0.5, 1.2]]
    for other in (Cluster(devices=4, backend="gloo"),
                  Cluster(devices=4, backend="gloo", kind_factors=(("all-gather", 0.6, 1.2),))):
        with pytest.raises(PlanMismatchError, match="re-plan for this cluster"):
            Plan.load(tmp_path / "p.json", cluster=other)
    # a file written before kind_factors existed: its cluster is the one without them
    old = dataclasses.asdict(Cluster(devices=4))
    del old["kind_factors"]
    dataclasses.replace(plan, cluster=old).save(tmp_path / "old.json")
    Plan.load(tmp_path / "old.json", cluster=Cluster(devices=4))
