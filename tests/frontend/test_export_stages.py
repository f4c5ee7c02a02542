"""A Hugging Face Llama traced with torch.export: what its graph says about the batch and the
backward, and its pipeline stages, each checked against a run of the model itself.

* Batch dims: a node with dims whose output has an axis that doubles when the batch doubles (the
  two runs' shapes, not autopar's propagation) has a batch dim (an opaque op, with no dims, runs
  whole whatever its shape). The attention mask, built from the batch's
  size alone (``arange``, an ``expand``, comparisons, ``where``), is the case the propagation
  through data inputs missed: a hierarchical plan then left it whole on every data-parallel rank.
* Backward: the nodes marked as running no backward are exactly the floating-point ones whose
  output autograd gives no ``requires_grad`` in a real run with the parameters trainable.
* Stages: the exported graph cut at several places (state read by name, ``codegen/exported.py``)
  and the stages chained in one process give the model's loss.
"""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx

import autopar
from autopar.codegen.exported import fx_form
from autopar.codegen.stage_split import check_stages, split_stages
from autopar.core.backward import NO_BACKWARD
from autopar.core.batch import batch_dims
from autopar.core.ir import FLOAT_DTYPES

pytest.importorskip("transformers")

SIZES = dict(layers=1, hidden=32, heads=2, kv_heads=1, mlp=64, vocab=64, seq=8)


def _llama(batch: int):
    from benchmarks.llama_small import factory

    return factory(**SIZES, batch=batch)


class _Values(fx.Interpreter):
    """Every node's value in a real run (shapes, ``requires_grad``)."""

    def __init__(self, gm):
        super().__init__(gm)
        self.values = {}

    def run_node(self, n):
        v = super().run_node(n)
        self.values[n.name] = v
        return v


@pytest.fixture(scope="module")
def traced():
    model, inputs = _llama(batch=4)
    graph = autopar.trace(model, inputs)
    assert graph.frontend == "export"
    return model, inputs, graph


def _run(graph, model, inputs) -> dict:
    run = _Values(fx_form(graph, model).fx_graph)
    run.run(*inputs)
    return run.values


def test_every_axis_that_scales_with_the_batch_is_a_batch_axis(traced):
    model, inputs, graph = traced
    small = _run(graph, model, inputs)
    _, twice = _llama(batch=8)
    big = _run(graph, model, twice)
    dims = batch_dims(graph)
    missed = []
    for node in graph.nodes:
        a, b = small.get(node.name), big.get(node.name)
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            continue
        scaled = [i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if y == 2 * x and x > 0]
        if scaled and node.dims and dims[node.name] is None:  # an opaque op (no dims) runs whole
            missed.append(node.name)
    assert not missed, f"nodes with an axis that scales with the batch but no batch dim: {missed}"
    # the attention mask's nodes are among them
    assert dims["where"] is not None


def test_nodes_marked_without_backward_are_those_autograd_records_none_for(traced):
    model, inputs, graph = traced
    values = _run(graph, model, inputs)
    marked, no_grad = set(), set()
    for node in graph.nodes:
        v = values.get(node.name)
        if not isinstance(v, torch.Tensor) or not any(s.dtype in FLOAT_DTYPES for s in node.outputs):
            continue
        if node.attrs.get(NO_BACKWARD):
            marked.add(node.name)
        if not v.requires_grad:
            no_grad.add(node.name)
    assert marked == no_grad
    assert "where" in marked and "embedding" not in marked  # the mask takes no gradient, the embedding does


def test_the_analytic_model_prices_no_backward_where_autograd_runs_none(traced):
    from autopar.cost_models.analytic import AnalyticModel
    from autopar.core.tables import Config

    _, _, graph = traced
    cluster = autopar.Cluster.preset("cpu", devices=1)
    model = AnalyticModel()

    def backward(name):
        node = graph.node(name)
        cost = model.node_breakdown(node, Config((1,) * len(node.dims), ((),) * len(node.dims)), cluster, "train")
        return sum(t.seconds for t in cost.terms if t.label == "compute backward")

    assert backward("where") == 0.0
    assert backward("embedding") > 0.0


def test_the_profiled_model_prices_no_backward_where_autograd_runs_none(traced, tmp_path):
    """The rotary tables (``cos``, ``sin`` of the positions times ``inv_freq``): floating-point
    ops whose operands the runner would make trainable, so a backward was measured for them."""
    from autopar.cost_models.profiled import ProfiledModel
    from autopar.core.tables import Config

    _, _, graph = traced
    cluster = autopar.Cluster.preset("cpu", devices=1)
    model = ProfiledModel(cache_path=str(tmp_path / "p.sqlite"), repeats=3, warmup=1)

    def terms(name):
        node = graph.node(name)
        cost = model.node_breakdown(node, Config((1,) * len(node.dims), ((),) * len(node.dims)), cluster, "train")
        return {t.label: t.seconds for t in cost.terms if t.kind == "compute"}

    for name in ("cos", "sin"):
        assert graph.node(name).attrs.get(NO_BACKWARD)
        measured = terms(name)
        assert measured["compute forward (measured)"] > 0.0
        assert measured["compute backward (measured)"] == 0.0
    assert terms("embedding")["compute backward (measured)"] > 0.0  # a node that runs one keeps it


@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.8])
def test_an_exported_graph_cut_into_stages_composes_to_the_model(traced, fraction):
    model, inputs, graph = traced
    names = [n.name for n in graph.nodes]
    cut = int(len(names) * fraction)
    gm = fx_form(graph, model).fx_graph
    parts = split_stages(gm, check_stages([names[:cut], names[cut:]], names), inputs)
    assert parts[0].carried_out == parts[1].carried_in
    first = fx.GraphModule(gm, parts[0].graph)
    last = fx.GraphModule(gm, parts[1].graph)
    inputs_by_name = dict(zip([n.target for n in gm.graph.nodes if n.op == "placeholder"], inputs))
    loss = last(*first(*inputs), **inputs_by_name)
    torch.testing.assert_close(loss, model(*inputs))
