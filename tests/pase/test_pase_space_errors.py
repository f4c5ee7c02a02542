"""PaSE's space on a model it has no nodes for (the gpt crashed with a bare
PaseViewError): one line that says what the space models, what this model has and what to use."""

import pytest

import autopar
from autopar.cli import main


def test_readme_gpt_under_pase_is_one_line_naming_the_ops_and_the_way_out(capsys):
    model, inputs = autopar.zoo.get("gpt", layers=2)
    graph = autopar.trace(model, inputs)
    no_node = {"permute", "sdpa", "slice"} & {n.op for n in graph.nodes}
    assert no_node  # the case: ops PaSE's graphs never had
    with pytest.raises(ValueError) as err:
        autopar.plan(model, inputs, autopar.Cluster(devices=8), cost_model="pase", space="pase", graph=graph)
    text = str(err.value)
    assert "\n" not in text
    assert all(op in text for op in no_node) and "cost_model='analytic'" in text and "zoo:transformer" in text
    assert main(["plan", "zoo:gpt:layers=2", "--cost-model", "pase", "--space", "pase"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_readme_pase_line_plans():
    """The README's PaSE call, on the model it now names, plans (and beats data parallel)."""
    model, inputs = autopar.zoo.get("transformer")
    plan = autopar.plan(model, inputs, autopar.Cluster(devices=8), cost_model="pase", space="pase")
    assert plan.units == "pase-flop" and plan.cost < plan.baselines["data_parallel"].cost
