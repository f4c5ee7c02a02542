"""Checkpoints (``autopar.save_checkpoint`` / ``load_checkpoint``, torch.distributed.checkpoint):
nothing is lost on a restart.

On 2 and 4 gloo processes, for a tensor-parallel plan (the planner's Megatron-style expert plan)
and a pipelined one (2 stages, 1 or 2 devices each): 3 steps, save, then in new processes a fresh
module loads the checkpoint and trains 3 more; its losses equal 6 steps straight through, and so
do its parameters (the straight run is the saving one: saving leaves training as it was). Each
checkpoint also loads into the module of the other plan, over that module's own trained parameters
(every one is replaced: they equal the saved ones), and in this process into the plain single-device model (full tensors, no process
group), whose next step gives the resumed run's loss. A save killed before it finished leaves the
previous step the one that loads. Before this there was no checkpoint at all.
"""

from __future__ import annotations

import dataclasses
import os
import signal

import pytest
import torch
from torch.distributed.tensor import DTensor

import autopar
from autopar.core.cluster import Cluster
from autopar.core.fingerprint import fingerprint
from autopar.core.tables import Config
from autopar.planning.plan import Plan, SearchInfo, Stage
from tests.helpers.dist_utils import run_gloo

SIZES = dict(batch=4, seq=8, width=16, heads=2, layers=2, vocab=32)
LR, EPS = 1e-2, 1e-3
KINDS = ("tp", "pipe")


def gpt(batch: int = SIZES["batch"]):
    return autopar.zoo.get("gpt", **{**SIZES, "batch": batch})


def make_plans(world: int) -> dict[str, Plan]:
    """A tensor-parallel plan on ``world`` devices and a 2-stage pipeline of ``world // 2`` each."""
    model, inputs = gpt()
    graph = autopar.trace(model, inputs)
    tp = autopar.plan(model, inputs, Cluster(devices=world)).baselines["expert"]
    assert any(s > 1 for c in tp.assignment.values() for s in c.splits)
    per = world // 2
    local = {}
    if per > 1:  # each stage Megatron-split on its own devices, planned at the microbatch size
        local = autopar.plan(*gpt(SIZES["batch"] // 2), Cluster(devices=per)).baselines["expert"].assignment
    names = [n.name for n in graph.nodes]
    cut = len(names) // 2
    cluster = Cluster(devices=world)
    full = {n: Config(c.splits, tuple(tuple(a + 1 for a in axes) for axes in c.mesh_axes))
            for n, c in local.items()}
    assignment = {n: full.get(n, Config((1,) * len(node.dims), ((),) * len(node.dims)))
                  for n, node in zip(names, graph.nodes)}
    pipe = Plan("gpt", fingerprint(graph), dataclasses.asdict(cluster), cluster.mesh(), "analytic", "mesh",
                "train", assignment, 0.0, "s", 0.0, SearchInfo("by hand", 0.0),
                stages=[Stage(names[:cut], per), Stage(names[cut:], per)], microbatches=2, schedule="1f1b")
    return {"tp": tp, "pipe": pipe}


@pytest.fixture(scope="module")
def plan_docs():
    """``world`` -> the plans' JSON documents, planned once per world size for the whole module."""
    cache: dict[int, dict] = {}

    def docs(world: int) -> dict:
        if world not in cache:
            cache[world] = {k: p.to_json() for k, p in make_plans(world).items()}
        return cache[world]

    return docs


def _full(module) -> dict[str, torch.Tensor]:
    """This rank's parameters as whole tensors (numpy: a child's tensors must not be shared)."""
    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone().numpy()
            for n, p in module.named_parameters()}


def _train(module, opt, inputs, steps) -> list[float]:
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        losses.append(float(module.train_step(*inputs)))
        opt.step()
    return losses


def _fresh(plan_doc):
    model, inputs = gpt()
    module = autopar.compile(model, inputs, plan=Plan.from_json(plan_doc))
    return module, torch.optim.AdamW(module.parameters(), lr=LR, eps=EPS), inputs


def first_half(rank, world, docs, folder):
    """6 steps, with a checkpoint after the third: the losses and parameters straight through, and
    the saved parameters (one module per plan: tracing and compiling once, not twice, per plan)."""
    out = {}
    for kind, doc in docs.items():
        module, opt, inputs = _fresh(doc)
        first = _train(module, opt, inputs, 3)
        out[kind] = {"first": first, "params3": _full(module)}
        autopar.save_checkpoint(os.path.join(folder, kind), module, opt, step=3)
        out[kind]["straight"] = first + _train(module, opt, inputs, 3)  # saving leaves training as it was
        out[kind]["params6"] = _full(module)
    return out


def second_half(rank, world, docs, folder):
    """New processes: a fresh module loads its plan's checkpoint and trains 3 more; then the other
    plan's checkpoint loads into it (over its trained parameters, which must all be replaced)."""
    out = {kind: {} for kind in docs}
    for kind, doc in docs.items():
        module, opt, inputs = _fresh(doc)
        step = autopar.load_checkpoint(os.path.join(folder, kind), module, opt)
        out[kind].update(step=step, resumed=_train(module, opt, inputs, 3), params6=_full(module))
        other = KINDS[1 - KINDS.index(kind)]
        autopar.load_checkpoint(os.path.join(folder, other), module, opt)
        out[other]["into_other"] = _full(module)
    return out


def _merged(per_rank: list[dict], kind: str, key: str) -> dict:
    """Every parameter once (pipeline stages hold different ones; replicas agree)."""
    merged = {}
    for r in per_rank:
        merged.update(r[kind][key])
    return merged


def _assert_params(got: dict, want: dict, what: str) -> None:
    assert set(got) == set(want), what
    for n in want:
        torch.testing.assert_close(torch.as_tensor(got[n]), torch.as_tensor(want[n]), rtol=1e-5, atol=1e-6,
                                   msg=lambda m, n=n: f"{what}: {n}: {m}")


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_resume_equals_straight_through(plan_docs, world, tmp_path):
    docs = plan_docs(world)
    first = run_gloo(first_half, world, docs, str(tmp_path))
    second = run_gloo(second_half, world, docs, str(tmp_path))
    for kind in KINDS:
        for r in range(world):
            straight, resumed = first[r][kind]["straight"], first[r][kind]["first"] + second[r][kind]["resumed"]
            assert second[r][kind]["step"] == 3
            assert resumed == pytest.approx(straight, rel=1e-5, abs=1e-6), f"{kind} rank {r}"
        _assert_params(_merged(second, kind, "params6"), _merged(first, kind, "params6"), f"{kind} after 3 + 3")
        # the other plan's module, loaded from this one's checkpoint: the saved parameters
        _assert_params(_merged(second, kind, "into_other"), _merged(first, kind, "params3"), f"{kind} into other")
        # the plain model, in this process, no process group: the same parameters, the same next loss
        model, inputs = gpt()
        opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS)
        assert autopar.load_checkpoint(tmp_path / kind, model, opt) == 3
        _assert_params({n: p.detach() for n, p in model.named_parameters()}, _merged(first, kind, "params3"),
                       f"{kind} into the plain model")
        opt.zero_grad()
        loss = model(*inputs)
        loss.backward()
        opt.step()
        assert float(loss) == pytest.approx(second[0][kind]["resumed"][0], rel=1e-5)


def save_then_die_mid_save(rank, world, doc, folder, saved):
    import torch.distributed.checkpoint.filesystem as fs

    module, opt, inputs = _fresh(doc)
    _train(module, opt, inputs, 1)
    autopar.save_checkpoint(folder, module, opt, step=1)
    torch.save(_full(module), os.path.join(saved, f"rank{rank}.pt"))  # what step 1 saved, for the test
    _train(module, opt, inputs, 1)

    def die(self, *args, **kwargs):  # the shards are written, the metadata is not: killed mid-save
        os.kill(os.getpid(), signal.SIGKILL)

    fs.FileSystemWriter.finish = die
    autopar.save_checkpoint(folder, module, opt, step=2)


def resume_after_the_crash(rank, world, doc, folder):
    module, opt, inputs = _fresh(doc)
    step = autopar.load_checkpoint(folder, module, opt)
    params = _full(module)
    autopar.save_checkpoint(folder, module, opt, step=step + 1)  # saving again over the partial one works
    return step, params


@pytest.mark.slow
@pytest.mark.dist
def test_a_save_killed_midway_leaves_the_previous_checkpoint(plan_docs, tmp_path):
    from autopar.runtime.checkpoint import steps
    from autopar.runtime.launch import LaunchError, launch

    doc = plan_docs(2)["tp"]
    folder = tmp_path / "checkpoints"
    with pytest.raises(LaunchError, match="killed by SIGKILL"):
        launch(save_then_die_mid_save, 2, doc, str(folder), str(tmp_path), timeout=300)
    assert steps(folder) == [1] and any(p.name.endswith(".partial") for p in folder.iterdir())
    after = run_gloo(resume_after_the_crash, 2, doc, str(folder))
    assert [s for s, _ in after] == [1, 1]
    _assert_params(after[0][1], torch.load(tmp_path / "rank0.pt", weights_only=False), "loaded after the crash")
    assert steps(folder) == [1, 2] and not any(p.name.endswith(".partial") for p in folder.iterdir())


def test_loading_what_is_not_there_is_one_line(tmp_path):
    model, inputs = gpt()
    with pytest.raises(ValueError, match="no checkpoint in"):
        autopar.load_checkpoint(tmp_path, model)
    autopar.save_checkpoint(tmp_path, model, step=0)  # the plain model saves too (no process group)
    other, _ = autopar.zoo.get("gpt", **{**SIZES, "width": 32})
    with pytest.raises(ValueError, match="of shape .* saved from a model of other sizes"):
        autopar.load_checkpoint(tmp_path, other)
    with pytest.raises(ValueError, match="no optimizer state"):
        autopar.load_checkpoint(tmp_path, model, torch.optim.AdamW(model.parameters()))
    assert autopar.load_checkpoint(tmp_path, model) == 0
