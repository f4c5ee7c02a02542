"""ZeRO-3 in codegen: parameters stored sliced over the ZeRO axes between steps, on 2
and 4 gloo processes against one device.

Per plan (data parallelism; on 4 devices also data x Megatron tensor parallelism, ZeRO over the
data axis only): 3 AdamW steps equal one device's; between steps the parameters' local tensors
hold no storage but the few parameters no ZeRO axis reduces, and the master slices 1/g of the
rest; after the forward only the root's (embeddings, head) are whole, each block having been
gathered for its forward and freed after it, as ``fully_shard`` per block does. A model-only checkpoint of the module loads into
a fresh ZeRO-3 module (whose next step, from the loaded master slices, equals one device's) and
into the plain model in this process; the sliced optimizer state is refused in one line.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.tensor import DTensor

import autopar
from autopar.planning.plan import Plan
from tests.helpers.dist_utils import run_gloo
from tests.helpers.training_plans import adamw_on_one_device, gpt, make_plans

LR, STEPS = 1e-2, 3
EPS = 1e-3  # the resumed step's fresh AdamW: a rounding-noise gradient must not step by +-LR


def _params(module) -> dict:
    module.unshard()
    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone().numpy()
            for n, p in module.named_parameters()}


def _held(module) -> int:
    """Bytes of storage behind the parameters' local tensors (each storage once)."""
    seen = {}
    for p in module.parameters():
        s = p.to_local().untyped_storage()
        seen[s.data_ptr() if s.nbytes() else id(s)] = s.nbytes()
    return sum(seen.values())


def worker(rank, world, docs, made, folder):
    torch.set_num_threads(1)
    out = {}
    for kind, doc in docs.items():
        model, inputs = copy.deepcopy(made[0]), made[1]
        module = autopar.compile(model, inputs, plan=Plan.from_json(doc), zero=3)
        opt = module.optimizer(torch.optim.AdamW, lr=LR)
        shards, buckets = module.reducer.shards, module.reducer.buckets
        res = out[kind] = {
            "local": sum(p.to_local().numel() * p.to_local().element_size() for p in module.parameters()),
            "sliced": sum(leaf.numel() * leaf.element_size() for b in shards for leaf in buckets[b]),
            "master": sum(z.master.numel() * z.master.element_size() for z in shards.values()),
            "parts": min(z.parts for z in shards.values()),
            "held": [_held(module)], "forward": []}
        for _ in range(STEPS):
            opt.zero_grad()
            loss = module(*inputs)
            res["forward"].append(_held(module))
            loss.backward()
            res["held"].append(_held(module))  # after the backward
            opt.step()
            res["held"].append(_held(module))  # after the step
        # the units gathered for the whole step (the root: embeddings, head), padding included
        res["root"] = sum(shards[b].numel * shards[b].master.element_size()
                          for u in module._units.whole for b in module._units.buckets[u])
        res["blocks"] = len(module._units.order)
        with torch.no_grad():
            res["eval"] = float(module(*inputs))
        res["held"].append(_held(module))
        with pytest.raises(ValueError, match="ZeRO optimizer") as e:
            autopar.save_checkpoint(f"{folder}/{kind}", module, opt, step=STEPS)
        res["refusal"] = str(e.value)
        autopar.save_checkpoint(f"{folder}/{kind}", module, step=STEPS)
        res["held"].append(_held(module))  # the save gathered them; the next step frees them
        res["params"] = _params(module)
        # a fresh ZeRO-3 module loads it; one more step from the loaded master slices
        model, inputs = copy.deepcopy(made[0]), made[1]
        fresh = autopar.compile(model, inputs, plan=Plan.from_json(doc), zero=3)
        res["loaded_step"] = autopar.load_checkpoint(f"{folder}/{kind}", fresh)
        res["loaded"] = _params(fresh)
        opt = fresh.optimizer(torch.optim.AdamW, lr=LR, eps=EPS)
        fresh.train_step(*inputs)
        opt.step()
        res["resumed"] = _params(fresh)
    return out


def one_device() -> dict:
    model, inputs = adamw_on_one_device(STEPS, LR)
    ref = {"params": {n: p.detach().clone() for n, p in model.named_parameters()}}
    with torch.no_grad():
        ref["eval"] = float(model(*inputs))
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS)  # the resumed run's fresh optimizer
    opt.zero_grad()
    model(*inputs).backward()
    opt.step()
    ref["resumed"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return ref


@pytest.fixture(scope="module", params=[2, 4])
def run(request, tmp_path_factory):
    world = request.param
    folder = tmp_path_factory.mktemp(f"zero3-{world}")
    return world, folder, run_gloo(worker, world, make_plans(world), gpt(), str(folder)), one_device()


def _close(got: dict, want: dict, what: str) -> None:
    assert set(got) == set(want), what
    for n in want:
        torch.testing.assert_close(torch.as_tensor(got[n]), want[n], rtol=1e-5, atol=1e-9,
                                   msg=lambda m, n=n: f"{what}: {n}: {m}")


@pytest.mark.dist
@pytest.mark.slow
def test_zero3_adamw_matches_one_device_and_stores_parameters_sliced(run):
    world, _, ranks, ref = run
    for kind in ranks[0]:
        parts = world if kind == "dp" else 2  # hybrid: the batch is split over mesh axis 0 only
        for r in ranks:
            z = r[kind]
            _close(z["params"], ref["params"], f"{kind} ZeRO-3, {world} ranks")
            assert z["eval"] == pytest.approx(ref["eval"], rel=1e-6)
            whole = z["local"] - z["sliced"]  # parameters no ZeRO axis reduces (a position embedding)
            assert z["parts"] == parts and z["sliced"] >= 0.95 * z["local"], (kind, z["parts"], z["sliced"])
            # between uses: only the unsliced parameters' storage, plus this rank's 1/g master slices
            assert z["held"][:-1] == [whole] * (2 * STEPS + 2), (kind, z["held"], whole)
            assert z["master"] <= z["sliced"] / parts + 8 * parts * 8, (kind, z["master"], z["sliced"])
            assert (whole + z["master"]) / z["local"] < 1 / parts + 0.05, kind
            # after the forward only the root's buckets are whole: each block was freed after its
            # forward (and is gathered again for its backward)
            assert z["blocks"] >= 2 and 0 < z["root"] < z["sliced"], (kind, z["blocks"], z["root"])
            assert z["forward"] == [whole + z["root"]] * STEPS, (kind, z["forward"], whole, z["root"])


@pytest.mark.dist
@pytest.mark.slow
def test_zero3_module_checkpoint_loads_and_resumes(run):
    world, folder, ranks, ref = run
    for kind in ranks[0]:
        for r in ranks:
            z = r[kind]
            assert z["refusal"].count("\n") == 0 and "save the module alone" in z["refusal"]
            assert z["held"][-1] >= z["local"]  # the save gathered the parameters to write them
            assert z["loaded_step"] == STEPS
            _close(z["loaded"], ref["params"], f"{kind} loaded, {world} ranks")
            # the master slices were reseeded from the loaded parameters: the step starts from them
            _close(z["resumed"], ref["resumed"], f"{kind} resumed, {world} ranks")
        plain, _ = gpt()  # and into the plain model, in this process (no process group)
        assert autopar.load_checkpoint(folder / kind, plain) == STEPS
        _close({n: p.detach() for n, p in plain.named_parameters()}, ref["params"], f"{kind} plain")


def _run_steps(rank, world, doc, made, stage):
    from autopar.cli.training import train_steps

    model, inputs = copy.deepcopy(made[0]), made[1]
    module = autopar.compile(model, inputs, plan=Plan.from_json(doc), zero=stage)
    return train_steps(module, inputs, STEPS, LR)


@pytest.mark.dist
def test_autopar_runs_training_loop_steps_zero_modules():
    """``autopar run``'s loop (``autopar.cli.training.train_steps``) steps a ZeRO-2/3 module with the
    module's own sliced optimizer: its losses are one device's (a plain AdamW over the parameters
    would step nothing under ZeRO-2 and find freed parameters under ZeRO-3). 2 ranks as threads."""
    from autopar.cli.training import single_process_losses
    from tests.helpers.dist_utils import run_threaded

    made = gpt()
    want = single_process_losses(made[0], made[1], STEPS, LR)
    for stage in (2, 3):
        for losses in run_threaded(_run_steps, 2, make_plans(2)["dp"], made, stage):
            assert losses == pytest.approx(want, rel=1e-6), stage


def _bf16_steps(rank, world, doc, made, recompute):
    model, inputs = copy.deepcopy(made[0]), made[1]
    module = autopar.compile(model, inputs, plan=Plan.from_json(doc), zero=3, precision="bf16", recompute=recompute)
    opt = module.optimizer(torch.optim.AdamW, lr=LR, eps=EPS)
    sliced = [leaf for b in module.reducer.shards for leaf in module.reducer.buckets[b]]
    losses, whole = [], []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = module(*inputs)
        # what the sliced parameters the program reads hold after the forward: the root's, whole
        whole.append(sum({leaf.untyped_storage().data_ptr(): leaf.untyped_storage().nbytes()
                          for leaf in sliced if leaf.untyped_storage().nbytes()}.values()))
        loss.backward()
        losses.append(float(loss.detach()))
        opt.step()
    root = sum(module.reducer.shards[b].numel for u in module._units.whole for b in module._units.buckets[u])
    return losses, _params(module), whole, root


def _bf16_one_device(made) -> tuple[list, dict]:
    """One device in bf16: the fp32 parameters cast for every step's forward, AdamW on them."""
    model, inputs = copy.deepcopy(made[0]), made[1]
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        cast = {n: p.to(torch.bfloat16) for n, p in model.named_parameters()}
        loss = torch.func.functional_call(model, cast, inputs)
        loss.backward()
        losses.append(float(loss.detach()))
        opt.step()
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.dist
def test_zero3_in_bf16_gathers_bf16_and_trains_like_one_bf16_device():
    """Mixed precision under ZeRO-3, as ``fully_shard`` with ``MixedPrecisionPolicy(param_dtype=
    bf16)``: the fp32 master slices cast before the all-gather, so a unit held whole (the root,
    after the forward) is its bf16 bytes, 2 a parameter, not fp32's 4; the losses and parameters
    within bf16's rounding of one bf16 device's, recomputed blocks or not. 2 ranks as threads."""
    from tests.helpers.dist_utils import run_threaded

    made, doc = gpt(torch.float32), make_plans(2)["dp"]
    want = _bf16_one_device(made)
    for recompute in (False, True):
        for losses, params, whole, root in run_threaded(_bf16_steps, 2, doc, made, recompute):
            assert root > 0 and whole == [2 * root] * STEPS, (recompute, whole, root)
            assert losses == pytest.approx(want[0], abs=0.035), recompute
            for n, p in want[1].items():
                torch.testing.assert_close(torch.as_tensor(params[n]), p, rtol=0, atol=2e-3,
                                           msg=lambda m, n=n: f"bf16 ZeRO-3, recompute {recompute}: {n}: {m}")
