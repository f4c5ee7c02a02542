"""A host's fixed work per op (``Cluster.op_overhead``) in the analytic model's compute, counted against
the ops torch.fx finds in the model.

Each op a step runs costs the host its dispatch whatever its size; the model charges it once per
node forward and ``backward_factor`` times in its backward, so a plan's compute grows by
(1 + backward_factor) x the overhead x the model's ops, whatever the sizes: the ops are counted
here by ``torch.fx.symbolic_trace``, not by autopar's graph.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.fx as fx

import autopar
from autopar.core.cluster import Cluster
from autopar.cost_models.analytic import AnalyticModel


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.ln, self.b = torch.nn.Linear(64, 128), torch.nn.LayerNorm(128), torch.nn.Linear(128, 8)

    def forward(self, x, y):
        h = torch.relu(self.ln(self.a(x))).transpose(0, 1).transpose(0, 1)
        return torch.nn.functional.cross_entropy(self.b(h), y)


@pytest.fixture(scope="module")
def priced():
    torch.manual_seed(0)
    model, inputs = Small(), (torch.randn(32, 64), torch.randint(0, 8, (32,)))
    ops = sum(n.op in ("call_module", "call_function", "call_method") for n in fx.symbolic_trace(model).graph.nodes)
    plans = {o: autopar.plan(model, inputs, dataclasses.replace(Cluster(devices=2), op_overhead=o),
                             cost_model="analytic", baselines=False) for o in (0.0, 1e-3)}
    return ops, plans


def test_every_op_pays_the_overhead_in_its_forward_and_backward(priced):
    ops, plans = priced
    grown = sum(r.compute for r in plans[1e-3].rows) - sum(r.compute for r in plans[0.0].rows)
    assert ops == 7
    assert grown == pytest.approx((1 + AnalyticModel.backward_factor) * 1e-3 * ops, rel=1e-6)


def test_the_searchs_tables_price_it_as_the_rows_do(priced):
    # plan.cost comes from the vectorised tables (``node_cost``), the rows from ``node_breakdown``
    ops, plans = priced
    assert [r.split for r in plans[1e-3].rows] == [r.split for r in plans[0.0].rows]
    assert plans[1e-3].cost - plans[0.0].cost == pytest.approx((1 + AnalyticModel.backward_factor) * 1e-3 * ops,
                                                               rel=1e-6)


def test_a_negative_overhead_is_refused():
    with pytest.raises(ValueError, match="op_overhead"):
        Cluster(devices=2, op_overhead=-1e-6)
