"""A pipelined plan's training options run inside its stages, as a single-stage plan's do.

The hierarchical search picks pipelined plans with bf16 mixed precision and recomputation; here
pinned plans (zero bubble's, pipeline 2 x data 2 on 4 gloo processes, stages of 2 devices; and
pipeline 2 on 2, stages of one device, zero bubble's or 1F1B's, which then run as a program on
a 1-device mesh) train with them. Recomputation (every block, attention cores, pointwise; llama with its attention
written out, so that it has cores) in float64 trains like one device (``check_pipelined``: the loss at every step, every gradient after the first, every
parameter after 3 AdamW steps), each stage wrapping only its own blocks, whose forward runs
again in the backward. bf16 has no float64 reference: the pipelined run matches the same model's
bf16 single-stage compiled run (``pipeline=False``) within bf16's rounding, and what crosses the
cut is bf16.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.distributed as dist
from torch.utils._pytree import tree_leaves

import autopar
from autopar.core.schedules import runs_as_priced
from tests.helpers.dist_utils import run_gloo
from tests.helpers.numerics import ATOL, EPS, LR, PARAM_ATOL, RTOL, check_pipelined, reference_run

# stages of 2 devices (a DTensor program each), and of one device
LAYOUTS = {"sharded": (4, "tensor=1,pipeline=2,data=2,microbatch=1"), "one-device": (2, "tensor=1,pipeline=2,data=1")}
MODES = (True, "attention", "pointwise")


def _pinned(model, inputs, layout: str, **options):
    world, pin = LAYOUTS[layout]
    cluster = autopar.Cluster.preset("cpu", devices=world)
    plan = autopar.plan(model, inputs, cluster, hierarchical=True, pin=pin, **{"zero": 0, **options})
    plan = plan.baselines["published"]
    assert [s.devices for s in plan.stages] == [world // 2] * 2
    # the planner weighs zero bubble only where codegen runs it at its priced bubble
    # (core.schedules.runs_as_priced: not under ZeRO-3 or pointwise recomputation); those plans
    # are 1F1B, and run here as zero bubble too (a schedule set by hand, which codegen still runs)
    priced = runs_as_priced("zero-bubble", options.get("zero", 0), options.get("recompute"))
    assert plan.schedule == "zero-bubble" or (not priced or layout == "one-device") and plan.schedule == "1f1b", \
        plan.schedule
    return plan if layout == "one-device" else dataclasses.replace(plan, schedule="zero-bubble")


def _recomputed(module) -> list:
    return [m for m in module.stage_module.program.module.modules() if type(m).__name__ == "Recomputed"]


def _counted(forward, calls: dict, key: str):
    def run(*args):
        calls[key] += 1
        return forward(*args)
    return run


def _recompute(rank, world, model, inputs, plans, ref):
    """Per mode: the stage's recomputed groups, and how often their forwards ran (wrapped, and
    the code inside: again in the backward) over the 3 steps."""
    out = {}
    for mode, plan in zip(MODES, plans):
        module = autopar.compile(model, inputs, plan=plan)
        wrapped = _recomputed(module)
        calls = {"wrapped": 0, "inner": 0}
        for m in wrapped:  # forward hooks do not fire in a recomputation: the forwards counted
            m.forward = _counted(m.forward, calls, "wrapped")
            m.inner.forward = _counted(m.inner.forward, calls, "inner")
        check_pipelined(rank, module, inputs, ref)
        out[str(mode)] = ([m.block for m in wrapped], {m.pointwise for m in wrapped}, calls)
    return out


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_recomputation_inside_stages_trains_like_one_device(layout):
    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("llama", batch=4, seq=16, width=32, heads=2, kv_heads=2, ffn=64, layers=2,
                                    vocab=64, attention="manual")
    model = model.double()
    plans = [_pinned(model, inputs, layout, recompute=mode) for mode in MODES]
    assert [p.strategy.options.recompute for p in plans] == list(MODES)
    world = LAYOUTS[layout][0]
    got = run_gloo(_recompute, world, model, inputs, plans, reference_run(model, inputs))
    for rank, modes in enumerate(got):
        stage = rank // (world // 2)
        for mode, (blocks, pointwise, calls) in modes.items():
            if mode == "attention":  # the stage's own attention core, one per block
                assert len(blocks) == 1 and blocks[0].startswith(f"blocks.{stage}."), (rank, blocks)
                assert blocks[0].endswith(f":attention{stage}"), (rank, blocks)
            else:
                assert blocks == [f"blocks.{stage}"], (rank, mode, blocks)  # its own block only
            assert pointwise == {mode == "pointwise"}, (rank, mode)
            # 3 steps x m microbatches forward (and the schedule's first shape inference), each
            # run again in the backward
            forwards = 3 * plans[0].microbatches + 1
            assert calls["wrapped"] == forwards and calls["inner"] >= 2 * forwards - 1, (rank, mode, calls)


def _train(module, inputs, step) -> tuple[list, dict]:
    opt = torch.optim.AdamW(module.parameters(), lr=LR, eps=EPS)
    losses, grads = [], {}
    for s in range(3):
        opt.zero_grad()
        losses.append(step(inputs).detach().float())
        if s == 0:
            grads = {n: p.grad.full_tensor().clone() for n, p in module.named_parameters()}
        opt.step()
    return losses, grads, {n: p.detach().full_tensor() for n, p in module.named_parameters()}


def _bf16(rank, world, model, inputs, plan):
    single = autopar.compile(model, world, inputs, pipeline=False, precision="bf16", zero=0, recompute=False)
    assert single.plan.strategy.options.precision == "bf16" and not single.plan.stages

    def backward(xs):
        loss = single(*xs)
        loss.backward()
        return loss

    want = _train(single, inputs, backward)
    piped = autopar.compile(model, inputs, plan=plan)
    sent = []
    piped.stage_module.register_forward_hook(
        lambda m, args, out: sent.extend(t.dtype for t in tree_leaves(out) if t.is_floating_point()))
    got = _train(piped, inputs, lambda xs: piped.train_step(*xs))
    return want, got, set(sent)


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_bf16_inside_stages_trains_like_the_single_stage_bf16_plan(layout):
    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("gpt", batch=4, seq=8, width=16, heads=2, layers=2, vocab=32)
    plan = _pinned(model, inputs, layout, recompute=False, precision="bf16")
    assert plan.strategy.options.precision == "bf16"
    for rank, (want, got, sent) in enumerate(run_gloo(_bf16, LAYOUTS[layout][0], model, inputs, plan)):
        assert sent == {torch.bfloat16}, (rank, sent)  # activations (and the loss) computed in bf16
        # bf16 keeps 8 bits: the losses agree to 2 units in the last place (1/64 below 4); the
        # gradients (fp32 sums of bf16 products, over other microbatch and rank splits) to 1e-3
        for step, (a, b) in enumerate(zip(got[0], want[0])):
            torch.testing.assert_close(a, b, rtol=0, atol=0.035, msg=lambda m, step=step: f"rank {rank} loss {step}: {m}")
        for n, g in got[1].items():
            torch.testing.assert_close(g, want[1][n], rtol=0.02, atol=1e-3, msg=lambda m, n=n: f"rank {rank} grad {n}: {m}")
        for n, p in got[2].items():
            torch.testing.assert_close(p, want[2][n], rtol=0, atol=2e-3, msg=lambda m, n=n: f"rank {rank} param {n}: {m}")


def _unsharded_grads(stage) -> dict:
    """Every parameter's gradient of a stage (data-parallel only: local = whole) under ZeRO: a
    sliced bucket's from the ranks' master slices (ZeRO-2 keeps no ``.grad``), gathered."""
    reducer = stage.reducer
    name = {id(p): n for n, p in stage.named_parameters()}
    of_leaf = {id(leaf): name[id(p)] for p, leaf in reducer.leaves}
    out = {n: p.grad.full_tensor().clone() for n, p in stage.named_parameters() if p.grad is not None}
    for b, z in reducer.shards.items():
        whole = torch.empty(z.numel, dtype=z.master.dtype)
        dist.all_gather_single(whole, z.master.grad.contiguous(), group=z.group)
        offset = 0
        for leaf in reducer.buckets[b]:
            got = whole[offset:offset + leaf.numel()].view_as(leaf)
            offset += leaf.numel()
            if of_leaf[id(leaf)] in out:  # ZeRO-1: the parameter's own gradient as well
                torch.testing.assert_close(out[of_leaf[id(leaf)]], got)
            out[of_leaf[id(leaf)]] = got
    return out


def _zero(rank, world, model, inputs, plans, ref):
    out = {}
    for stage, plan in zip((1, 2), plans):
        module = autopar.compile(model, inputs, plan=plan)
        opt = module.optimizer(torch.optim.AdamW, lr=LR, eps=EPS)
        kept = []
        for step in range(3):
            opt.zero_grad()
            loss = module.train_step(*inputs)
            torch.testing.assert_close(loss, ref.losses[step], rtol=RTOL, atol=ATOL,
                                       msg=lambda m, step=step: f"rank {rank} ZeRO-{stage} loss {step}: {m}")
            if step == 0:
                grads = _unsharded_grads(module.stage_module)
                assert set(grads) == {n for n, _ in module.named_parameters()}
                for n, g in grads.items():
                    torch.testing.assert_close(g, ref.grads[n], rtol=RTOL, atol=ATOL,
                                               msg=lambda m, n=n: f"rank {rank} ZeRO-{stage} grad {n}: {m}")
                kept = [n for n, p in module.named_parameters() if p.grad is not None]
            opt.step()
        for n, p in module.named_parameters():
            torch.testing.assert_close(p.detach().full_tensor(), ref.params[n], rtol=RTOL, atol=PARAM_ATOL,
                                       msg=lambda m, n=n: f"rank {rank} ZeRO-{stage} param {n}: {m}")
        out[stage] = (opt.state_numel(), sum(p.numel() for p in module.parameters()), kept)
    return out


@pytest.mark.slow
@pytest.mark.dist
def test_zero_1_and_2_inside_sharded_stages_train_like_one_device():
    """ZeRO-1/2 over each stage's 2 data-parallel ranks: 2 microbatches' backwards a step (zero
    bubble's weight halves summed through ``reduce_added``), the mean over them taken on the master
    slices (ZeRO-2 keeps no parameter gradient), the optimizer state halved."""
    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("gpt", batch=4, seq=8, width=16, heads=2, layers=2, vocab=32)
    model = model.double()
    plans = [_pinned(model, inputs, "sharded", recompute=False, zero=stage) for stage in (1, 2)]
    assert [p.strategy.options.zero for p in plans] == [1, 2]
    for rank, got in enumerate(run_gloo(_zero, 4, model, inputs, plans, reference_run(model, inputs))):
        for stage, (state, params, kept) in got.items():
            assert state <= params + 2, (rank, stage, state, params)  # AdamW's 2 states, over 2 ranks
            assert bool(kept) == (stage == 1), (rank, stage, kept)


def _refusals(rank, world, model, inputs, plain) -> list[str]:
    out = []
    for plan, options in ((plain, dict(zero=1)), (plain, dict(zero=3))):
        with pytest.raises(ValueError) as e:
            autopar.compile(model, inputs, plan=plan, **options)
        out.append(str(e.value))
    return out


@pytest.mark.dist
def test_what_stages_do_not_generate_is_refused_in_one_line():
    """ZeRO-1 or 3 on stages of one device (no data-parallel ranks to slice over): a one-line
    ValueError saying what to plan instead."""
    from tests.helpers.dist_utils import run_threaded

    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("gpt", batch=4, seq=8, width=16, heads=2, layers=2, vocab=32)
    plain = _pinned(model, inputs, "one-device", recompute=False)
    for messages in run_threaded(_refusals, 2, model, inputs, plain):
        assert all("\n" not in m for m in messages), messages
        assert "ZeRO-1 is generated in pipelines for stages of several devices" in messages[0]
        assert "ZeRO-3 is generated in pipelines for stages of several devices only" in messages[1]


def _bf16_one_device(model, inputs) -> tuple[list, dict]:
    """One device in bf16: the fp32 parameters cast for every step's forward, AdamW on them."""
    model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = torch.func.functional_call(model, {n: p.to(torch.bfloat16) for n, p in model.named_parameters()},
                                          inputs)
        loss.backward()
        losses.append(loss.detach().float())
        opt.step()
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def _zero3(rank, world, runs):
    """Per (model, inputs, plan): the losses, the first step's gradients (from the master slices),
    the parameters after 3 steps, the all-gathers of sliced buckets each step, this rank's sliced
    buckets, and the bytes they hold whole between steps."""
    out = []
    for model, inputs, plan in runs:
        module = autopar.compile(model, inputs, plan=plan)
        stage = module.stage_module
        opt = module.optimizer(torch.optim.AdamW, lr=LR, eps=EPS)
        held, gathers, losses, grads = set(), [], [], {}
        real = dist.all_gather_single

        def counted(output, input, *args, **kwargs):
            gathers[-1] += any(input is z.source for z in stage.reducer.shards.values())
            return real(output, input, *args, **kwargs)

        dist.all_gather_single = counted
        try:
            for step in range(3):
                opt.zero_grad()
                gathers.append(0)
                losses.append(module.train_step(*inputs).detach().float())
                if step == 0:
                    grads = _unsharded_grads(stage)
                opt.step()
                held.add(sum(t.untyped_storage().nbytes() for z in stage.reducer.shards.values()
                             for t in (z.flat, z.compute) if t is not None))
        finally:
            dist.all_gather_single = real
        # the stage's state dict gathers its parameters whole (stored sliced between steps)
        params = {n: p.detach().full_tensor().clone() for n, p in module.state_dict().items()}
        units = stage._units  # the buckets of the blocks (gated) and of the root (whole for the step)
        buckets = [sum(len(units.buckets[u]) for u in us) for us in (units.order, units.whole)]
        out.append((losses, grads, params, gathers, buckets, held))
    return out


@pytest.mark.slow
@pytest.mark.dist
def test_zero3_inside_sharded_stages_trains_like_one_device():
    """ZeRO-3 over each stage's 2 data-parallel ranks (pipeline 2 x data 2; zero bubble's schedule,
    then 1F1B's), each block's parameters gathered for each microbatch's forward and again for its
    backward and freed between, as the price counts them (2 all-gathers of each block's bucket per
    microbatch), the root's whole over the step (and nothing whole between steps): float64 trains like one device; bf16 (the
    buckets gathered in bf16) within bf16's rounding of one bf16 device."""
    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("gpt", batch=4, seq=8, width=16, heads=2, layers=2, vocab=32)
    wide, low = copy.deepcopy(model).double(), copy.deepcopy(model).float()
    runs = [(wide, inputs, _pinned(wide, inputs, "sharded", recompute=False, zero=3)),
            (low, inputs, _pinned(low, inputs, "sharded", recompute=False, zero=3, precision="bf16"))]
    cluster = autopar.Cluster.preset("cpu", devices=4)
    runs.append((wide, inputs, autopar.plan(wide, inputs, cluster, hierarchical=True, recompute=False, zero=3,
                                            pin=LAYOUTS["sharded"][1] + ",schedule=1f1b").baselines["published"]))
    assert [p.strategy.options.zero for _, _, p in runs] == [3] * 3
    assert [p.schedule for _, _, p in runs] == ["zero-bubble", "zero-bubble", "1f1b"]
    assert runs[1][2].strategy.options.precision == "bf16"
    ref, ref16 = reference_run(wide, inputs), _bf16_one_device(low, inputs)
    for rank, got in enumerate(run_gloo(_zero3, 4, runs)):
        for k, (losses, grads, params, gathers, buckets, held) in enumerate(got):
            what = f"rank {rank}, plan {k}"
            m = runs[k][2].microbatches
            # after the first step (the schedule's shape inference runs a forward more): each block's
            # buckets twice a microbatch, the root's once a step
            blocks, roots = buckets
            assert m >= 2 and blocks >= 1 and gathers[1:] == [2 * m * blocks + roots] * 2 and held == {0}, \
                (what, m, buckets, gathers, held)
            assert set(params) == {n for n, _ in runs[k][0].named_parameters() if n in params} and params
            if k == 1:  # bf16
                for step, loss in enumerate(losses):
                    torch.testing.assert_close(loss, ref16[0][step], rtol=0, atol=0.035, msg=lambda m: f"{what}: {m}")
                for n, p in params.items():
                    torch.testing.assert_close(p, ref16[1][n], rtol=0, atol=2e-3, msg=lambda m, n=n: f"{what} {n}: {m}")
                continue
            for step, loss in enumerate(losses):
                torch.testing.assert_close(loss, ref.losses[step].float(), rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")
            assert set(grads) == set(params), what
            for n, g in grads.items():
                torch.testing.assert_close(g, ref.grads[n], rtol=RTOL, atol=ATOL, msg=lambda m, n=n: f"{what} grad {n}: {m}")
            for n, p in params.items():
                torch.testing.assert_close(p, ref.params[n], rtol=RTOL, atol=PARAM_ATOL,
                                           msg=lambda m, n=n: f"{what} param {n}: {m}")
