"""A cost model is anything with the ``CostModel`` contract (``autopar.core.cost_model``): the
analytic, profiled and PaSE models have it, and a model written here plans end to end through
``autopar.plan``, to the optimum a brute force over the space finds under that same model."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn as nn

import autopar
from autopar.core.cost_model import CostModel, NodeCost, Term
from autopar.core.space import configs_for


class ToyModel:
    """Compute: FLOPs over the parts, plus a fixed overhead per split dim; an edge: the tensor's
    bytes times how far apart the two ends' part counts are (in factors of two). Nothing like a
    real machine: only the contract matters."""

    name = "toy"
    units = "s"

    @staticmethod
    def _one(node, config) -> float:
        return node.flops / math.prod(config.splits) * 1e-9 + 3e-7 * sum(s > 1 for s in config.splits)

    def node_cost(self, node, configs, cluster, mode="train"):
        return np.array([self._one(node, c) for c in configs])

    def edge_cost(self, src, src_output, dst, dst_input, src_configs, dst_configs, cluster, mode="train"):
        nbytes = src.outputs[src_output].nbytes
        level = [[math.log2(math.prod(c.splits)) for c in cs] for cs in (src_configs, dst_configs)]
        return np.array([[nbytes * 1e-10 * abs(a - b) for b in level[1]] for a in level[0]])

    def output_cost(self, node, output, configs, cluster, mode="train"):
        return np.array([1e-7 * (math.prod(c.splits) > 1) for c in configs])

    def node_breakdown(self, node, config, cluster, mode="train", text=True):
        return NodeCost(node.name, config, [Term("toy compute", self._one(node, config))])


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), (torch.randn(4, 8),)


def _brute(graph, cluster, model) -> float:
    """The least toy cost over every assignment of the space, summed here from the model alone."""
    mesh = cluster.mesh()
    configs = [configs_for(n, mesh, "mesh") for n in graph.nodes]
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    outputs = {index[name]: out for name, out in graph.outputs}
    best = math.inf
    for pick in itertools.product(*(range(len(c)) for c in configs)):
        total = sum(model._one(n, configs[i][pick[i]]) for i, n in enumerate(graph.nodes))
        total += sum(model.output_cost(graph.nodes[i], o, [configs[i][pick[i]]], cluster)[0]
                     for i, o in outputs.items())
        for e in graph.edges:
            u, v = index[e.src], index[e.dst]
            total += model.edge_cost(graph.nodes[u], e.src_output, graph.nodes[v], e.dst_input,
                                     [configs[u][pick[u]]], [configs[v][pick[v]]], cluster)[0, 0]
        best = min(best, total)
    return best


def test_the_shipped_models_have_the_contract(tmp_path):
    from autopar.cost_models.analytic import AnalyticModel
    from autopar.cost_models.profiled import ProfiledModel
    from autopar.pase.model import PaseModel

    for model in (AnalyticModel(), ProfiledModel(cache_path=str(tmp_path / "cache.sqlite"), fit_comm=False),
                  PaseModel(), ToyModel()):
        assert isinstance(model, CostModel), type(model).__name__


def test_a_toy_model_plans_end_to_end_to_the_brute_force_optimum(mlp):
    model, inputs = mlp
    cluster = autopar.Cluster(devices=4)
    toy = ToyModel()
    plan = autopar.plan(model, inputs, cluster, cost_model=toy, baselines=False, pipeline=False,
                        follow=False, zero=0, precision="fp32")  # as the brute force prices it: fp32, no ZeRO
    graph = autopar.trace(model, inputs)
    assert plan.cost_model == "toy" and plan.units == "s"
    assert plan.cost == pytest.approx(_brute(graph, cluster, toy), rel=1e-9)
    # the plan's own rows are the toy's terms
    assert {t.label for r in plan.rows for t in r.terms} >= {"toy compute"}


def test_an_object_without_the_contract_is_refused_in_one_line(mlp):
    class NoEdges:
        name, units = "half", "s"

        def node_cost(self, node, configs, cluster, mode="train"):
            return np.zeros(len(configs))

    with pytest.raises(ValueError, match="cost_model must be a name .* or a cost model object with"):
        autopar.plan(*mlp, 4, cost_model=NoEdges(), baselines=False)
