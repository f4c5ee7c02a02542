"""A position embedding looked up at ``torch.arange(seq)`` positions (rather than sliced) is a
weight view too (``core.weight_views``): under data parallelism its gradient, a partial sum over
the batch, is summed with the weight's in the reducer's bucket, overlapped with the backward, not
by a blocking all-reduce on the edge; and the cost model lists and prices that one bucket."""

import pytest
import torch

import autopar
from autopar.codegen.runtime import Reshard
from autopar.core.weight_views import WEIGHT_VIEW
from autopar.cost_models.collectives import predicted_collectives
from tests.helpers.dist_utils import run_threaded
from tests.helpers.models import PositionLookup
from tests.helpers.numerics import check_module, reference_run


def _rank(rank, world, model, inputs, plan, ref):
    module = autopar.compile(model, inputs, plan=plan)
    summed_on_edges = [m for m in module.program.module.modules()
                       if isinstance(m, Reshard) and any(p.is_partial() for p in m.spec.grad_in)]
    check_module(rank, module, inputs, ref)
    return module.program.reduce_axes["pos.weight"], len(summed_on_edges)


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_position_lookup_gradient_goes_in_the_bucket(frontend):
    torch.manual_seed(0)
    model, inputs = PositionLookup(), PositionLookup.inputs()
    graph = autopar.trace(model, inputs, frontend=frontend)
    assert [n.attrs[WEIGHT_VIEW] for n in graph.nodes if WEIGHT_VIEW in n.attrs] == ["param:pos.weight"]
    cluster = autopar.Cluster.preset("cpu", devices=2)
    plan = autopar.plan(model, inputs, cluster, graph=graph, pipeline=False).baselines["data_parallel"]
    # priced as run: one backward all-reduce, the bucket, with the position table in it
    pred = predicted_collectives(graph, plan.assignment, cluster)
    assert pred.counts("backward") == {"all_reduce": 1}
    (bucket,) = pred.of("grad-sync")
    assert "param:pos.weight" in bucket.tensors
    results = run_threaded(_rank, 2, model, inputs, plan, reference_run(model, inputs))
    # the table's gradient summed by the reducer over the batch axis; no edge sums a gradient
    assert results == [((0,), 0)] * 2
