"""What crosses a cut between pipeline stages of several devices: each rank's shard, in the layout
the plan gives the tensor, trained exactly like one device.

4 gloo processes: the float64 GPT in 2 stages x 2 devices, 1F1B over 2 microbatches. Stage 0
splits the batch over its 2 devices, so the tensor it sends is cut along the batch: each rank
sends and the rank at its place in stage 1 receives half the microbatch (checked on the tensors
the stage module returns and is given). Stage 1 either splits the batch the same way (the shard
is used as it comes) or runs unsplit (it gathers the halves, and gives back each sender the
gradient of its half). Against the single-device run: the loss of each of 3 AdamW steps, every
gradient after the first backward, every parameter after the last step.

2 gloo processes: a 1F1B plan with fewer microbatches than stages runs, in GPipe's order (the
same order for that count), with the same numerics.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

import autopar
from autopar.codegen.pipeline import pipeline_module
from tests.helpers.dist_utils import run_gloo
from tests.helpers.numerics import EPS, LR, STEPS, reference_run
from tests.helpers.plans import data_parallel, two_stage_plan
from tests.helpers.training_plans import gpt

MICRO = 2  # microbatches of the 4-sequence batch: 2 sequences each, 1 per device of a stage
TOL = dict(rtol=1e-10, atol=1e-12)  # float64: any difference beyond rounding is a wrong value


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _assignment(graph, stage1: str) -> dict:
    """Batch split over the stage's axis in stage 0; in stage 1 the same, or nothing."""
    dp = data_parallel(graph, (2,))
    if stage1 == "whole":
        second = {n.name for n in graph.nodes[len(graph.nodes) // 2:]}
        dp = {k: c for k, c in dp.items() if k not in second}
    return dp


def _train(rank, world, cases):
    out = {}
    for case, schedule, micro, devices, stage1 in cases:
        model, inputs = gpt()
        graph = autopar.trace(model, inputs)
        assignment = _assignment(graph, stage1) if devices > 1 else None
        plan = two_stage_plan(graph, micro, schedule, devices=devices, assignment=assignment)
        mod = pipeline_module(model, plan, inputs, graph=graph)
        seen = []  # (what the stage module is given, what it returns): first dims of the tensors
        mod.stage_module.register_forward_hook(lambda m, args, result: seen.append(
            ([a.shape[0] for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()],
             [r.shape[0] for r in (result if isinstance(result, tuple) else (result,)) if r.dim()])))
        opt = torch.optim.AdamW(mod.parameters(), lr=LR, eps=EPS)
        losses, grads = [], {}
        for step in range(STEPS):
            opt.zero_grad()
            losses.append(mod.train_step(*inputs).numpy().copy())
            if step == 0:
                grads = {n: _full(p.grad).detach().numpy().copy() for n, p in mod.named_parameters()}
            opt.step()
        params = {n: _full(p.detach()).numpy().copy() for n, p in mod.named_parameters()}
        out[case] = dict(losses=losses, grads=grads, params=params, seen=seen[:1], stage=mod.stage_index)
    return out


def _check(per_rank, case):
    model, inputs = gpt()
    ref = reference_run(model, inputs)
    for rank, r in enumerate(per_rank):
        res = r[case]
        for step, loss in enumerate(res["losses"]):
            torch.testing.assert_close(torch.from_numpy(loss), ref.losses[step], **TOL,
                                       msg=lambda m: f"{case} rank {rank} step {step} loss: {m}")
        assert res["grads"] and set(res["params"]) == set(res["grads"])
        for n, g in res["grads"].items():
            torch.testing.assert_close(torch.from_numpy(g), ref.grads[n], **TOL,
                                       msg=lambda m, n=n: f"{case} rank {rank} grad {n}: {m}")
        for n, p in res["params"].items():
            torch.testing.assert_close(torch.from_numpy(p), ref.params[n], **TOL,
                                       msg=lambda m, n=n: f"{case} rank {rank} param {n}: {m}")
    # every parameter trained on some rank
    assert set().union(*(r[case]["params"] for r in per_rank)) == set(ref.params)


WIDE = [("sharded-both", "1f1b", MICRO, 2, "split"), ("sharded-then-whole", "1f1b", MICRO, 2, "whole")]


@pytest.fixture(scope="module")
def wide():
    return run_gloo(_train, 4, WIDE)


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("case", [c[0] for c in WIDE])
def test_stages_send_their_shards_and_train_like_one_device(wide, case):
    _check(wide, case)
    micro = 4 // MICRO
    for rank, r in enumerate(wide):
        (given, returned), = r[case]["seen"]
        if r[case]["stage"] == 0:  # sends its half of the microbatch's activations, not all of it
            assert returned and set(returned) == {micro // 2}, (rank, returned)
        else:  # receives the half the rank at its place in stage 0 sent
            assert given and set(given) == {micro // 2}, (rank, given)


@pytest.mark.slow
@pytest.mark.dist
def test_1f1b_with_fewer_microbatches_than_stages_runs_in_gpipe_order():
    per_rank = run_gloo(_train, 2, [("1f1b-1", "1f1b", 1, 1, "")])
    _check(per_rank, "1f1b-1")


def test_the_report_says_1f1b_with_fewer_microbatches_than_stages_runs_as_gpipe():
    model, inputs = gpt()
    graph = autopar.trace(model, inputs)
    text = two_stage_plan(graph, 1, "1f1b").report()
    assert "1F1B with fewer microbatches than stages (1 < 2) runs in GPipe's order" in text, text
    assert "GPipe's order" not in two_stage_plan(graph, 2, "1f1b").report()


def test_1f1b_with_fewer_microbatches_than_stages_is_priced_as_gpipe_holds():
    from autopar.search.pipeline import in_flight

    # 4 stages, 3 microbatches: GPipe's order holds all 3 on every stage, the last included
    assert [in_flight("1f1b", k, 4, 3) for k in range(4)] == [3, 3, 3, 3]
    assert [in_flight("1f1b", k, 4, 8) for k in range(4)] == [4, 3, 2, 1]  # enough: 1F1B's own
