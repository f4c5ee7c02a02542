"""Expert parallelism's token exchange is priced on the live group's own all-to-all fit: the
fitted line's terms become the cluster's all-to-all links (``CommFit.kind_factors``), and each of
an experts node's all-to-alls costs ``(p-1) a + (p-1)/p N / bw`` on them, recomputed here from the
fit's figures and the node's shapes; a fit on a real 2-process gloo group yields the terms."""

from __future__ import annotations

import math

import pytest

import autopar
from autopar.core.tables import Config
from autopar.cost_models.collective_fit import CommFit, fit_collectives
from autopar.cost_models.experts import exchange_seconds
from autopar.cost_models.profiled import ProfiledModel
from tests.helpers.dist_utils import run_gloo

CPU4 = autopar.Cluster.preset("cpu", devices=4)
FIT = CommFit(latency=1e-3, bandwidth=1e9, world=4, gather_latency=2e-3, gather_bandwidth=0.5e9,
              all_to_all_latency=0.1e-3, all_to_all_bandwidth=2e9)


@pytest.fixture(scope="module")
def experts_node():
    model, inputs = autopar.zoo.get("moe", batch=4, seq=8, width=32, hidden=64, experts=4, top_k=2, layers=1)
    graph = autopar.trace(model, inputs)
    return graph, next(n for n in graph.nodes if n.op == "moe_experts")


def _split_experts(node, p: int) -> Config:
    names = [d.name for d in node.dims]
    return Config(tuple(p if d == "experts" else 1 for d in names),
                  tuple((0, 1) if d == "experts" else () for d in names))


def test_the_fit_s_all_to_all_becomes_the_cluster_s_all_to_all_link():
    linked = ProfiledModel._with_links(CPU4, FIT)
    assert linked.kind_link("all-to-all", linked.intra_bandwidth, linked.intra_latency) == \
        pytest.approx((2e9, 0.1e-3))
    assert linked.kind_link("all-gather", linked.intra_bandwidth, linked.intra_latency) == \
        pytest.approx((0.5e9, 2e-3))


def test_the_exchange_is_priced_on_the_fitted_all_to_all(experts_node):
    graph, node = experts_node
    linked = ProfiledModel._with_links(CPU4, FIT)
    mesh = linked.mesh()
    seconds, text = exchange_seconds(node, _split_experts(node, 4), mesh, linked)
    tokens, hidden = node.inputs[0].spec.shape
    k, itemsize, p = 2, node.inputs[0].spec.itemsize, 4
    rows = tokens / p * k  # each rank's routed rows
    sent = [8.0 * p, rows * 8, rows * hidden * itemsize, rows * hidden * itemsize,
            rows * hidden * itemsize, rows * hidden * itemsize]  # counts, ids, dispatch, combine, their grads
    expect = sum((p - 1) * 0.1e-3 + (p - 1) / p * n / 2e9 for n in sent)
    assert seconds == pytest.approx(expect, rel=1e-9), text


def test_profiling_a_graph_with_experts_fits_the_all_to_all_too(experts_node, tmp_path):
    graph, _ = experts_node
    model = ProfiledModel(cache_path=str(tmp_path / "p.sqlite"), optimizer=None, fit_comm=False)
    model.profile(graph, autopar.Cluster.preset("cpu", devices=1))
    assert "all-to-all" in model.comm_kinds


def _fit(rank, world):
    fit = fit_collectives(sizes=(2 ** 12, 2 ** 16, 2 ** 18), repeats=3, gap=1e-3, burst=2,
                          kinds=("all-reduce", "all-to-all"))
    return fit.all_to_all_latency, fit.all_to_all_bandwidth, fit.kind_factors()


def test_a_live_gloo_group_fits_its_all_to_all():
    for latency, bandwidth, factors in run_gloo(_fit, 2):
        assert latency > 0 and math.isfinite(bandwidth) and bandwidth > 0
        assert [k for k, _, _ in factors] == ["all-to-all"]


NEAR = CommFit(latency=0.5e-3, bandwidth=1e9, world=4, all_to_all_latency=0.02e-3, all_to_all_bandwidth=3e9)


def test_the_exchanges_that_follow_another_are_priced_on_the_near_fit(experts_node, tmp_path):
    graph, node = experts_node
    model = ProfiledModel(cache_path=str(tmp_path / "p.sqlite"), optimizer=None)
    model.comm, model.near, model._comm_done = FIT, NEAR, True
    [term] = [t for t in model.node_breakdown(node, _split_experts(node, 4), CPU4).terms if t.kind == "exchange"]
    tokens, hidden = node.inputs[0].spec.shape
    p, rows = 4, tokens / 4 * 2
    rows_bytes = rows * hidden * node.inputs[0].spec.itemsize
    far = lambda n: (p - 1) * 0.1e-3 + (p - 1) / p * n / 2e9  # noqa: E731
    near = lambda n: (p - 1) * 0.02e-3 + (p - 1) / p * n / 3e9  # noqa: E731
    # the counts after the router's compute, the ids and the rows right after them, the results
    # after the experts' compute; backward: both gradients after compute
    expect = far(8.0 * p) + near(rows * 8) + near(rows_bytes) + 3 * far(rows_bytes)
    assert term.seconds == pytest.approx(expect, rel=1e-9), term.formula
