"""Expert parallelism over experts written as an ``nn.ModuleList`` of expert modules (the zoo's
``moe(listed=True)``: a loop over the list, ``index_add`` of each expert's routed tokens) trains
like one device on 2 and 4 gloo processes (float64): the loss at every step, every gradient and
every parameter after 3 AdamW steps (``tests/helpers/numerics``), against a single-device run.

Cases: "forced", the experts split over the whole mesh, data parallelism elsewhere ("export": the
same, traced by torch.export, whose graph holds the loop's ops until they are folded into one
call); "mixed" (4 processes), experts over one mesh axis and tokens over the other. The list is traced as one
``moe_experts`` node whose experts dim the plan splits; each rank runs only its experts' modules,
on the tokens the all-to-all brings it, and stores only their weights: each rank's bytes of the
lists' parameters (and of their gradients and AdamW state) are the whole lists' over the expert
degree; a checkpoint of it resumes exactly."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.distributed as dist

import autopar
from autopar.core.tables import Config
from tests.helpers.dist_utils import run_gloo, run_threaded
from tests.helpers.numerics import ATOL, EPS, LR, PARAM_ATOL, RTOL, STEPS, check_module, reference_run

pytestmark = pytest.mark.slow

SIZES = dict(batch=4, seq=8, width=16, hidden=24, experts=4, top_k=2, layers=2, classes=8, listed=True)
TWO, FOUR = ["forced", "export"], ["forced", "mixed"]


def build():
    model, (x, labels) = autopar.zoo.get("moe", **SIZES)
    return model.double().train(), (x.double(), labels)


def _plan(model, inputs, world, kind):
    graph = autopar.trace(model, inputs, frontend="export") if kind == "export" else None
    best = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=world), pipeline=False, graph=graph)
    dp = best.baselines["data_parallel"]
    experts = [n for n in dp.graph.nodes if n.op == "moe_experts"]
    assert len(experts) == SIZES["layers"], "the expert lists traced to no moe_experts node"
    shape = tuple(dp.mesh.shape)
    everything = tuple(range(len(shape)))
    ep, tokens = (everything, ()) if kind != "mixed" else ((len(shape) - 1,), tuple(range(len(shape) - 1)))
    assignment = dict(dp.assignment)
    for n in experts:
        names = [d.name for d in n.dims]
        axes = {"experts": ep, "tokens": tokens}
        assignment[n.name] = Config(tuple(math.prod(shape[a] for a in axes.get(d, ())) for d in names),
                                    tuple(axes.get(d, ()) for d in names))
    return dataclasses.replace(dp, assignment=assignment, baselines={})


def _resumes(module, opt, model, inputs, world, kind, folder) -> None:
    """A checkpoint of the module and its optimizer (each rank writing its own experts) loaded into
    a fresh module of the same plan: the next step's loss and parameters are the saved run's."""
    autopar.save_checkpoint(folder, module, opt, step=1)
    fresh = autopar.compile(model, inputs, plan=_plan(model, inputs, world, kind))
    fresh_opt = fresh.optimizer(torch.optim.AdamW, lr=1e-3)
    autopar.load_checkpoint(folder, fresh, fresh_opt)
    losses = []
    for m, o in ((module, opt), (fresh, fresh_opt)):
        o.zero_grad()
        losses.append(m.train_step(*inputs))
        o.step()
        m.unshard()
    torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=0)
    for (n, a), (_, b) in zip(module.named_parameters(), fresh.named_parameters()):
        torch.testing.assert_close(b.full_tensor(), a.full_tensor(), rtol=0, atol=0, msg=lambda m, n=n: f"{n}: {m}")


def _train(rank, world, cases, folder) -> dict:
    out = {}
    for kind in cases:
        try:
            model, inputs = build()
            ref = reference_run(model, inputs)
            module = autopar.compile(model, inputs, plan=_plan(model, inputs, world, kind))
            degree = 2 if kind == "mixed" else world
            runs = [m for m in module.program.module.modules() if type(m).__name__ == "ExpertsCall"]
            assert runs and all(r.local == SIZES["experts"] // degree for r in runs), [repr(r) for r in runs]
            total = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if _expert(n))
            assert _held(module) == total / degree, (_held(module), total, degree)
            assert module.held_elsewhere and not module.held_elsewhere & set(module.program.state)  # not fed
            check_module(rank, module, inputs, ref)
            # after training (and the whole model read back to compare): a step holds the own experts only
            opt = module.optimizer(torch.optim.AdamW, lr=1e-3)
            module.train_step(*inputs)
            opt.step()
            assert _held(module) == total / degree, ("parameters", _held(module), total, degree)
            grads = sum(p.grad._local_tensor.numel() * p.element_size() for n, p in module.named_parameters()
                        if _expert(n) and p.grad is not None)  # views of the reducer's buckets: by elements
            assert grads == total / degree, ("gradients", grads, total, degree)
            state = sum(v.numel() * v.element_size() for p, st in opt.state.items() for k, v in st.items()
                        if k != "step" and any(p is q for n, q in module.named_parameters() if _expert(n)))
            assert state == 2 * total / degree, ("AdamW state", state, total, degree)
            # a state dict holds the whole model on every rank (each expert from its holder)
            whole = {n: t.full_tensor() for n, t in module.state_dict().items() if _expert(n)}
            assert sum(t.numel() * t.element_size() for t in whole.values()) == total
            flat = torch.cat([t.reshape(-1) for t in whole.values()])
            low, high = flat.clone(), flat.clone()
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            dist.all_reduce(high, op=dist.ReduceOp.MAX)
            assert torch.equal(low, high) and flat.abs().min() > 0, "the ranks' state dicts differ"
            module.load_state_dict(module.state_dict())
            module(*inputs)
            assert _held(module) == total / degree, ("after a load and a forward", _held(module), total, degree)
            if kind != "export":  # the same program as "forced" once built
                _resumes(module, opt, model, inputs, world, kind, f"{folder}/{kind}")
            out[kind] = None
        except Exception as e:  # noqa: BLE001 - each case reports its own failure
            out[kind] = f"{type(e).__name__}: {str(e)[:800]}"
    return out


def _expert(name: str) -> bool:
    return ".experts.experts." in name  # an expert list's weights (MoEBlock.experts.experts)


def _held(module) -> int:
    """Bytes this rank stores for the expert lists' weights."""
    return sum(p._local_tensor.untyped_storage().nbytes() for n, p in module.named_parameters() if _expert(n))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return {w: run_gloo(_train, w, cases, str(tmp_path_factory.mktemp(f"experts{w}"))) for w, cases in ((2, TWO), (4, FOUR))}


@pytest.mark.parametrize("world,kind", [(2, k) for k in TWO] + [(4, k) for k in FOUR])
def test_expert_list_split_over_ranks_trains_like_one_device(trained, world, kind):
    for rank, results in enumerate(trained[world]):
        assert results[kind] is None, f"rank {rank}: {results[kind]}"


def test_an_expert_list_is_one_experts_node_with_its_experts_dim():
    model, inputs = build()
    graph = autopar.trace(model, inputs)
    [first, _] = [n for n in graph.nodes if n.op == "moe_experts"]
    assert dict((d.name, d.size) for d in first.dims)["experts"] == SIZES["experts"]
    assert len(first.params) == SIZES["experts"] * 2  # each expert's gate_up and down
    # FLOPs of the routed tokens: each token through top_k experts' two matmuls
    width, hidden, tokens = SIZES["width"], SIZES["hidden"], SIZES["batch"] * SIZES["seq"]
    assert first.flops == 2 * tokens * SIZES["top_k"] * (2 * hidden * width + width * hidden)
    torch.testing.assert_close(model(*inputs), model(*inputs))  # the model itself runs


def _zero_check(rank, world, model, inputs, plan, ref):
    module = autopar.compile(model, inputs, plan=plan)
    opt = module.optimizer(torch.optim.AdamW, lr=LR, eps=EPS)
    for step in range(STEPS):
        opt.zero_grad()
        torch.testing.assert_close(module.train_step(*inputs), ref.losses[step], rtol=RTOL, atol=ATOL)
        opt.step()
    held = _held(module)
    module.unshard()
    for n, p in module.named_parameters():
        torch.testing.assert_close(p.full_tensor(), ref.params[n], rtol=RTOL, atol=PARAM_ATOL,
                                   msg=lambda m, n=n: f"rank {rank} param {n}: {m}")
    return held


@pytest.mark.parametrize("zero", [2, 3])
def test_an_expert_list_split_under_zero_trains_like_one_device(zero):
    """ZeRO over the data axes beside the expert split (the hierarchical pin ``expert=2,data=4`` on
    4 ranks): each rank's own experts' optimizer state sliced over the token axes; the losses and
    the parameters after 3 AdamW steps are one device's. ZeRO-2 keeps the own experts' weights
    whole (half the list's); ZeRO-3 frees them too between steps."""
    model, inputs = build()
    plan = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=4), hierarchical=True,
                        pin="tensor=1,pipeline=1,expert=2,data=4", zero=zero, recompute=False).baselines["published"]
    total = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if _expert(n))
    held = run_threaded(_zero_check, 4, model, inputs, plan, reference_run(model, inputs))
    assert held == [total // 2 if zero == 2 else 0] * 4
