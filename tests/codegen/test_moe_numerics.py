"""Expert parallelism trains like one device: Hugging Face Mixtral and Qwen2-MoE (float64, no
capacity factor: every token reaches its experts) on 2 and 4 gloo processes, their experts split
over the devices and the tokens exchanged by all-to-all, against a single-device run: the loss
at every step, every gradient, every parameter after 3 AdamW steps (``tests/helpers/numerics``).

Cases: "forced", experts over the whole mesh (on 4 processes the two axes of a (2, 2) mesh,
one flattened group) and data parallelism elsewhere; "mixed" (4 processes), experts over one mesh axis and tokens over the other (expert parallelism inside
data-parallel groups: the expert weights' gradients are summed across the groups); "chosen",
autopar's own plan for a model whose experts are large enough that it picks expert parallelism.
Each launch trains all its cases; a case reports its own error."""

from __future__ import annotations

import dataclasses
import math

import pytest

import autopar
from autopar.core.tables import Config
from tests.helpers.dist_utils import run_gloo
from tests.helpers.moe_models import build
from tests.helpers.numerics import check_module, reference_run

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

TWO = [("mixtral", "forced"), ("qwen2_moe", "forced"), ("mixtral", "chosen")]
FOUR = [("mixtral", "forced"), ("qwen2_moe", "mixed")]
CHOSEN = dict(intermediate_size=2048, batch=4, seq=64)  # big experts: splitting them pays on the cpu preset


def _experts_config(node, mesh_shape, experts_axes, token_axes) -> Config:
    names = [d.name for d in node.dims]
    axes = {"experts": tuple(experts_axes), "tokens": tuple(token_axes)}
    return Config(tuple(math.prod(mesh_shape[a] for a in axes.get(d, ())) for d in names),
                  tuple(axes.get(d, ()) for d in names))


def _plan(model, kwargs, world, kind):
    best = autopar.plan(model, kwargs, autopar.Cluster.preset("cpu", devices=world), pipeline=False)
    experts = [n for n in best.graph.nodes if n.op == "moe_experts"]
    assert experts, "the experts traced to no moe_experts node"
    if kind == "chosen":
        assert all(dict(zip([d.name for d in n.dims], best.assignment[n.name].splits))["experts"] == world
                   for n in experts), "the planner did not choose expert parallelism"
        return best
    dp = best.baselines["data_parallel"]
    shape = tuple(dp.mesh.shape)
    everything = tuple(range(len(shape)))
    ep, tokens = (everything, ()) if kind == "forced" else ((len(shape) - 1,), tuple(range(len(shape) - 1)))
    assignment = {**dp.assignment, **{n.name: _experts_config(n, shape, ep, tokens) for n in experts}}
    return dataclasses.replace(dp, assignment=assignment, baselines={})


def _train(rank, world, cases) -> dict:
    out = {}
    for name, kind in cases:
        try:
            model, kwargs = build(name, **(CHOSEN if kind == "chosen" else {}))
            ref = reference_run(model, (), kwargs=kwargs)
            module = autopar.compile(model, kwargs, plan=_plan(model, kwargs, world, kind))
            check_module(rank, module, (), ref, kwargs=kwargs)
            out[(name, kind)] = None
        except Exception as e:  # noqa: BLE001 - each case reports its own failure
            out[(name, kind)] = f"{type(e).__name__}: {str(e)[:800]}"
    return out


@pytest.fixture(scope="module")
def trained():
    return {2: run_gloo(_train, 2, TWO), 4: run_gloo(_train, 4, FOUR)}


@pytest.mark.parametrize("world,name,kind", [(2, *c) for c in TWO] + [(4, *c) for c in FOUR],
                         ids=[f"{w}-{n}-{k}" for w, cases in ((2, TWO), (4, FOUR)) for n, k in cases])
def test_expert_parallel_moe_trains_like_one_device(trained, world, name, kind):
    for rank, results in enumerate(trained[world]):
        assert results[(name, kind)] is None, f"rank {rank}: {results[(name, kind)]}"
