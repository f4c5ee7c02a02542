"""Interleaved 1F1B in codegen (codegen/interleaved.py): the GPT cut into 4 stages on 2 gloo
processes (v = 2 stages per rank: rank 0 holds stages 0 and 2, rank 1 stages 1 and 3), trained
by torch's ScheduleInterleaved1F1B, against the single-device run of ``tests/helpers/numerics.py``:
the loss of each of 3 AdamW steps on every rank, every parameter's gradient after the first
backward, every parameter after the last step; plans it cannot run are refused in one line."""

from __future__ import annotations

import pytest
import torch

import autopar
from autopar.codegen.pipeline import pipeline_module
from autopar.core.tables import Config, Mesh
from autopar.planning.plan import Plan, SearchInfo, Stage
from tests.helpers.dist_utils import run_gloo
from tests.helpers.numerics import ATOL, EPS, LR, PARAM_ATOL, RTOL, STEPS, reference_run

SIZES = dict(batch=4, seq=8, width=16, heads=2, layers=2, vocab=32)


def interleaved_plan(graph, stages: int, microbatches: int) -> Plan:
    """``stages`` one-device stages of about equal node counts (the plan a search would cut)."""
    names = [n.name for n in graph.nodes]
    bounds = [round(k * len(names) / stages) for k in range(stages + 1)]
    full = {n.name: Config((1,) * len(n.dims), ((),) * len(n.dims)) for n in graph.nodes}
    return Plan("hand", "", {}, Mesh((2,)), "analytic", "mesh", "training", full, 0.0, "s", 0.0,
                SearchInfo("by hand", 0.0),
                stages=[Stage(names[a:b], 1) for a, b in zip(bounds, bounds[1:])],
                microbatches=microbatches, schedule="interleaved-1f1b", graph=graph)


def train(rank, world, cases):
    torch.set_num_threads(1)
    out = {}
    for micro in cases:
        model, inputs = autopar.zoo.get("gpt", **SIZES)
        graph = autopar.trace(model, inputs)
        plan = Plan.from_json(interleaved_plan(graph, 4, micro).to_json())
        mod = pipeline_module(model, plan, inputs, graph=graph)
        opt = torch.optim.AdamW(mod.parameters(), lr=LR, eps=EPS)
        res = {"stages": mod.stage_indices, "losses": [], "eval": float(mod(*inputs))}
        for step in range(STEPS):
            opt.zero_grad()
            loss = mod.train_step(*inputs)
            res["losses"].append(float(loss))
            if step == 0:
                res["grads"] = {n: p.grad.clone() for n, p in mod.named_parameters()}
            opt.step()
        res["params"] = {n: p.detach().clone() for n, p in mod.named_parameters()}
        out[micro] = res
    errors = []
    for stages, micro in ((3, 2), (4, 5)):  # stages not a multiple of the ranks; rounds that do not split
        try:
            pipeline_module(model, interleaved_plan(graph, stages, micro), inputs, graph=graph)
            errors.append("built")
        except ValueError as e:
            errors.append(str(e))
    out["errors"] = errors
    return out


@pytest.fixture(scope="module")
def trained():
    return run_gloo(train, 2, (2, 4)), reference_run(*autopar.zoo.get("gpt", **SIZES))


@pytest.mark.dist
@pytest.mark.parametrize("micro", [2, 4])
def test_interleaved_1f1b_trains_like_one_device(trained, micro):
    ranks, ref = trained
    assert [r[micro]["stages"] for r in ranks] == [[0, 2], [1, 3]]
    owned = [set(r[micro]["grads"]) for r in ranks]
    assert not owned[0] & owned[1] and owned[0] | owned[1] == set(ref.params)
    for r in ranks:
        got = r[micro]
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.stack(ref.losses), rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(got["eval"], float(ref.losses[0]), rtol=RTOL, atol=ATOL)
        for n, g in got["grads"].items():
            torch.testing.assert_close(g, ref.grads[n], rtol=RTOL, atol=ATOL, msg=lambda m, n=n: f"grad {n}: {m}")
        for n, p in got["params"].items():
            torch.testing.assert_close(p, ref.params[n], rtol=RTOL, atol=PARAM_ATOL, msg=lambda m, n=n: f"{n}: {m}")


@pytest.mark.dist
def test_plans_interleaved_1f1b_cannot_run_are_refused_in_one_line(trained):
    ranks, _ = trained
    first, second = ranks[0]["errors"]
    assert "multiple (at least 2) of the 2 ranks" in first and "\n" not in first
    assert "rounds of 2" in second and "\n" not in second
