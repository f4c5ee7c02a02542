"""Interleaved 1F1B with several devices per stage and with training options, as the hierarchical
planner plans it: the GPT cut into 4 stages over 2 pipeline ranks (v = 2 stages per rank, rank r
holding stages r and r + 2), each stage a program on a 2-device sub-mesh, on 4 gloo processes.

In float64, data 2 inside the stages (each stage's gradients summed over its two data ranks),
tensor 2 inside them (the weights split), data 2 with every block recomputed, and (the zoo's
Llama) context 2 inside them, each stage's attention a ring over its own 2 ranks, each train
like one device (``check_pipelined``: the loss at every step, every gradient after the first,
every parameter after 3 AdamW steps); ZeRO-1 and ZeRO-2 over each stage's data ranks train like
one device with the optimizer state halved (ZeRO-3 is refused in one line: the planner does not
weigh it with interleaved stages). bf16 on one-device stages (2 processes) has no
float64 reference: it matches the same model's bf16 single-stage run within bf16's rounding.
The stages each rank runs are the ones the planner priced on it (stage k on rank k mod p, as
torch's schedule sends them), holding exactly those stages' parameters.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Shard

import autopar
from tests.helpers.dist_utils import run_gloo
from tests.helpers.numerics import ATOL, EPS, LR, PARAM_ATOL, RTOL, check_pipelined, reference_run

SIZES = dict(batch=4, seq=8, width=16, heads=2, layers=2, vocab=32)
# name -> (pin, options)
CASES = {
    "data": ("tensor=1,pipeline=2,data=2", {}),
    "tensor": ("tensor=2,pipeline=2,data=1", {}),
    "recompute": ("tensor=1,pipeline=2,data=2", dict(recompute=True)),
    "zero1": ("tensor=1,pipeline=2,data=2", dict(zero=1)),
    "zero2": ("tensor=1,pipeline=2,data=2", dict(zero=2)),
    "context": ("tensor=1,pipeline=2,context=2,data=1,ring=1", {}),  # the Llama
}


def _plan(model, inputs, world: int, pin: str, **options):
    cluster = autopar.Cluster.preset("cpu", devices=world)
    plan = autopar.plan(model, inputs, cluster, hierarchical=True, pin=pin + ",schedule=interleaved-1f1b",
                        **{"zero": 0, "recompute": False, **options}).baselines["published"]
    assert plan.schedule == "interleaved-1f1b" and len(plan.stages) == 4, (plan.schedule, plan.stages)
    assert [s.devices for s in plan.stages] == [world // 2] * 4
    return plan


def _stage_params(graph, plan, indices: list[int], names: set[str]) -> set[str]:
    """The model parameters the plan's stages ``indices`` read."""
    return {o.source.removeprefix("param:") for k in indices for n in plan.stages[k].nodes
            for o in graph.node(n).params} & names


def _zero_step(rank, module, inputs, ref) -> int:
    """3 steps with the module's (sharded) optimizer against ``ref``; the state it holds."""
    opt = module.optimizer(torch.optim.AdamW, lr=LR, eps=EPS)
    for step in range(3):
        opt.zero_grad()
        loss = module.train_step(*inputs)
        torch.testing.assert_close(loss, ref.losses[step], rtol=RTOL, atol=ATOL,
                                   msg=lambda m, step=step: f"rank {rank} loss {step}: {m}")
        opt.step()
    for n, p in module.named_parameters():
        torch.testing.assert_close(p.detach().full_tensor(), ref.params[n], rtol=RTOL, atol=PARAM_ATOL,
                                   msg=lambda m, n=n: f"rank {rank} param {n}: {m}")
    return opt.state_numel()


def _attentions(stage) -> list[tuple[str, int | None]]:
    """How each attention of a stage's program runs: a ``Ring`` over its parts, or gathered."""
    from autopar.codegen.calls import NodeCall

    return [(type(m.call.balance).__name__, getattr(m.call.balance, "parts", None))
            for m in stage.program.module.modules() if isinstance(m, NodeCall) and m.call.node.op == "sdpa"]


def _train(rank, world, jobs):
    torch.set_num_threads(1)
    out = {}
    for case, (model, inputs, plan, ref) in jobs.items():
        module = autopar.compile(model, inputs, plan=plan)
        stages = module._stages
        got = {"indices": module.stage_indices,
               "torch_ranks": dict(stages[0].stage_index_to_group_rank),  # where torch sends each stage
               "recomputed": [m.block for s in module.stage_modules for m in s.program.module.modules()
                              if type(m).__name__ == "Recomputed"],
               "split": sorted(n for n, p in module.named_parameters()
                               if any(isinstance(x, Shard) for x in p.placements)),
               "attentions": [_attentions(s) for s in module.stage_modules]}
        if plan.strategy.options.zero:
            got["state"] = _zero_step(rank, module, inputs, ref)
            got["numel"] = sum(p.numel() for p in module.parameters())
            got["names"] = [n for n, _ in module.named_parameters()]
        else:
            got["eval"] = float(module(*inputs))  # forward only, through the schedule's eval
            got["names"] = check_pipelined(rank, module, inputs, ref)
        out[case] = got
    return out


@pytest.fixture(scope="module")
def trained():
    """Every case in one launch of 4 processes: (per rank, per case what it ran), the plans, and
    per case the traced graph, the model and its single-device run."""
    torch.manual_seed(0)
    gpt = autopar.zoo.get("gpt", **SIZES)
    llama = autopar.zoo.get("llama", batch=4, seq=16, width=32, heads=2, kv_heads=1, ffn=64, layers=2,
                            vocab=64)
    jobs, models = {}, {}
    for (model, inputs), cases in ((gpt, [c for c in CASES if c != "context"]), (llama, ["context"])):
        model = model.double()
        ref, graph = reference_run(model, inputs), autopar.trace(model, inputs)
        for case in cases:
            pin, options = CASES[case]
            jobs[case] = (model, inputs, _plan(model, inputs, 4, pin, **options), ref)
            models[case] = (graph, model)
    plans = {c: j[2] for c, j in jobs.items()}
    return run_gloo(_train, 4, jobs), plans, {c: (*m, jobs[c][3]) for c, m in models.items()}


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("case", ["data", "tensor", "recompute", "context"])
def test_interleaved_sharded_stages_train_like_one_device(trained, case):
    ranks, plans, models = trained
    graph, model, ref = models[case]
    names = {n for n, _ in model.named_parameters()}
    held = [set(r[case]["names"]) for r in ranks]
    assert set().union(*held) == names
    for rank, r in enumerate(ranks):
        got, pp = r[case], rank // 2
        # the planner prices rank r with stages r, r + p (its round-robin); torch sends them so
        assert got["indices"] == [pp, pp + 2] and got["torch_ranks"] == {k: k % 2 for k in range(4)}, got
        assert set(got["names"]) == _stage_params(graph, plans[case], got["indices"], names), rank
        torch.testing.assert_close(got["eval"], float(ref.losses[0]), rtol=RTOL, atol=ATOL)
        if case == "tensor":  # weights split over the stage's two devices, as the plan has them
            assert got["split"], rank
        if case == "recompute":  # each stage wraps its own block only (rank 0: stage 2's blocks.1)
            mine = [n for k in got["indices"] for n in plans[case].stages[k].nodes]
            own = [b for b in plans[case].strategy.recompute
                   if any(graph.node(n).module.startswith(b + ".") for n in mine)]
            assert sorted(got["recomputed"]) == own == [f"blocks.{1 - pp}"], (rank, got["recomputed"])
        if case == "context":  # the block's attention on the rank's stage 1 or 2, a ring of its 2 ranks
            assert sorted(got["attentions"]) == [[], [("Ring", 2)]], (rank, got["attentions"])


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("case", ["zero1", "zero2"])
def test_interleaved_zero_inside_stages_trains_like_one_device(trained, case):
    """ZeRO over each stage's 2 data ranks: AdamW's 2 states of the rank's stages' parameters, halved."""
    ranks, plans, _ = trained
    assert plans[case].strategy.options.zero == int(case[-1])
    for rank, r in enumerate(ranks):
        got = r[case]
        # 2 states over 2 ranks (a slice padded by one per stage)
        assert got["state"] <= got["numel"] + 4, (rank, got["state"], got["numel"])


def _bf16(rank, world, model, inputs, plan):
    torch.set_num_threads(1)
    single = autopar.compile(model, world, inputs, pipeline=False, precision="bf16", zero=0, recompute=False)
    assert single.plan.strategy.options.precision == "bf16" and not single.plan.stages
    piped = autopar.compile(model, inputs, plan=plan)
    sent = []
    for stage in piped.stage_modules:
        stage.register_forward_hook(lambda m, args, out: sent.extend(
            t.dtype for t in (out if isinstance(out, tuple) else (out,)) if t.is_floating_point()))
    result = []
    runs = ((single, lambda: _backward(single(*inputs))), (piped, lambda: piped.train_step(*inputs)))
    for module, step in runs:
        opt = torch.optim.AdamW(module.parameters(), lr=LR, eps=EPS)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            losses.append(step().detach().float())
            opt.step()
        result.append((losses, {n: p.detach().full_tensor() for n, p in module.named_parameters()}))
    return result, set(sent)


def _backward(loss):
    loss.backward()
    return loss


@pytest.mark.slow
@pytest.mark.dist
def test_interleaved_bf16_trains_like_the_single_stage_bf16_plan():
    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("gpt", **SIZES)
    plan = _plan(model, inputs, 2, "tensor=1,pipeline=2,data=1", precision="bf16")
    assert plan.strategy.options.precision == "bf16"
    ranks = run_gloo(_bf16, 2, model, inputs, plan)
    assert set().union(*(got[1] for (_, got), _ in ranks)) == {n for n, _ in model.named_parameters()}
    for rank, ((want, got), sent) in enumerate(ranks):
        assert sent == {torch.bfloat16}, (rank, sent)  # what crosses the cuts (and the loss) in bf16
        # bf16 keeps 8 bits: the losses agree to 2 units in the last place (1/64 below 4)
        for step, (a, b) in enumerate(zip(got[0], want[0])):
            torch.testing.assert_close(a, b, rtol=0, atol=0.035,
                                       msg=lambda m, step=step: f"rank {rank} loss {step}: {m}")
        for n, p in got[1].items():
            torch.testing.assert_close(p, want[1][n], rtol=0, atol=2e-3,
                                       msg=lambda m, n=n: f"rank {rank} param {n}: {m}")


def _refused(rank, world, model, inputs, plan) -> str:
    from autopar.codegen.pipeline import pipeline_module

    with pytest.raises(ValueError) as e:  # ``autopar.compile`` checks the count before; codegen too
        pipeline_module(model, plan, inputs)
    return str(e.value)


@pytest.mark.dist
def test_an_interleaved_plan_on_the_wrong_process_count_is_refused_in_one_line():
    """The 4-process plan of stages of 2 devices on 2 processes: one line saying how many to launch
    (not a DeviceMesh error from inside torch)."""
    from tests.helpers.dist_utils import run_threaded

    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("gpt", **SIZES)
    plan = _plan(model, inputs, 4, CASES["data"][0])
    for message in run_threaded(_refused, 2, model, inputs, plan):
        assert message.startswith("the plan runs on 4 processes (stages of 2 devices)"), message
        assert "\n" not in message


@pytest.mark.dist
def test_zero3_in_an_interleaved_plan_is_refused_in_one_line():
    """A hand-edited interleaved plan with ZeRO-3 (the planner does not weigh it): one line saying
    what to plan instead, not a crash inside the schedule."""
    import dataclasses

    from tests.helpers.dist_utils import run_threaded

    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("gpt", **SIZES)
    plan = _plan(model, inputs, 4, CASES["zero2"][0], zero=2)
    opts = dataclasses.replace(plan.strategy.options, zero=3)
    plan = dataclasses.replace(plan, strategy=dataclasses.replace(plan.strategy, options=opts))
    for message in run_threaded(_refused, 4, model, inputs, plan):
        assert message.startswith("ZeRO-3 is generated in 1F1B and zero-bubble pipelines"), message
        assert "\n" not in message
