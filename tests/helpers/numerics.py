"""The numerics check every codegen test uses: a sharded run against a single-device run.

``reference_run`` trains a copy of the model on one device: forward, backward, AdamW, STEPS times,
recording the first loss, the first gradients and the final parameters. ``check_rank`` does the
same on one rank of a sharded module and compares: the loss at every step, every parameter's
gradient after the first backward (``full_tensor()``), every parameter after the last step.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from autopar.codegen.module import shard_module

STEPS = 3
LR = 1e-2
RTOL, ATOL = 1e-5, 1e-6
# Adam divides by sqrt(v) + eps, so a step changes by up to lr/eps times a gradient's difference.
# A gradient that is zero in exact arithmetic (GPT's key bias: a softmax ignores a constant added
# to every score of a row) is rounding noise of ~1e-9 whose sign would otherwise decide a full
# lr-sized step. With eps = 1e-3 such noise moves a parameter ~1e-8, and gradients that agree to
# ATOL give parameters that agree to ATOL * lr / eps = PARAM_ATOL. Both runs use this optimizer.
EPS = 1e-3
PARAM_ATOL = ATOL * LR / EPS


@dataclass
class Reference:
    losses: list[torch.Tensor]
    grads: dict[str, torch.Tensor]
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]


def loss_of(out) -> torch.Tensor:
    """The loss a forward returns: itself, ``out["loss"]`` or ``out.loss`` (a ModelOutput)."""
    return out["loss"] if isinstance(out, dict) else getattr(out, "loss", out)


def reference_run(model, inputs, steps: int = STEPS, kwargs=None) -> Reference:
    model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS)
    losses, grads = [], {}
    for step in range(steps):
        opt.zero_grad()
        loss = loss_of(model(*inputs, **(kwargs or {})))
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        losses.append(loss.detach().clone())
        opt.step()
    return Reference(losses, grads, {n: p.detach().clone() for n, p in model.named_parameters()},
                     {n: b.clone() for n, b in model.named_buffers()})


def check_rank(rank, world, model, inputs, graph, assignment, mesh_shape, ref: Reference,
               steps: int = STEPS) -> None:
    check_module(rank, shard_module(model, graph, assignment, mesh_shape), inputs, ref, steps)


def check_module(rank, sharded, inputs, ref: Reference, steps: int = STEPS, feed=None, kwargs=None) -> None:
    """Train ``sharded`` (this rank's module) as ``reference_run`` trained one copy, and compare.
    ``feed``: what this rank passes the module (default ``inputs``, the whole batch); ``kwargs``:
    keyword inputs beside them."""
    feed = inputs if feed is None else feed
    kwargs = kwargs or {}
    names = [n for n, _ in sharded.named_parameters()]
    assert names == list(ref.params), f"parameter names changed: {names}"
    opt = torch.optim.AdamW(sharded.parameters(), lr=LR, eps=EPS)
    for step in range(steps):
        opt.zero_grad()
        loss = loss_of(sharded(*feed, **kwargs))
        assert type(loss) is torch.Tensor, "the sharded module must return plain tensors"
        torch.testing.assert_close(loss, ref.losses[step], rtol=RTOL, atol=ATOL,
                                   msg=lambda m: f"rank {rank} step {step} loss: {m}")
        loss.backward()
        if step == 0:
            elsewhere = set(getattr(sharded, "held_elsewhere", ()))  # other ranks' experts: no gradient here
            for n, p in sharded.named_parameters():
                if n in elsewhere:
                    assert p.grad is None, f"{n}: another rank's expert got a gradient here"
                    continue
                assert p.grad is not None, f"{n} got no gradient"
                assert p.grad.placements == p.placements, \
                    f"{n}: grad {p.grad.placements} vs param {p.placements}"
                torch.testing.assert_close(p.grad.full_tensor(), ref.grads[n], rtol=RTOL, atol=ATOL,
                                           msg=lambda m, n=n: f"rank {rank} grad {n}: {m}")
        opt.step()
    if hasattr(sharded, "unshard"):
        sharded.unshard()  # parameters stored in part (ZeRO-3, other ranks' experts) whole, to compare
    for n, p in sharded.named_parameters():
        torch.testing.assert_close(p.full_tensor(), ref.params[n], rtol=RTOL, atol=PARAM_ATOL,
                                   msg=lambda m, n=n: f"rank {rank} param {n} after {steps}: {m}")
    for n, b in sharded.named_buffers():  # batch-norm running statistics, masks
        torch.testing.assert_close(b.full_tensor(), ref.buffers[n], rtol=RTOL, atol=PARAM_ATOL,
                                   msg=lambda m, n=n: f"rank {rank} buffer {n} after {steps}: {m}")


def check_pipelined(rank, module, inputs, ref: Reference, steps: int = STEPS) -> list[str]:
    """Train a pipelined rank's module (its ``train_step`` runs the whole schedule) as
    ``reference_run`` trained one copy: the loss at every step, and the gradients after the first
    backward and the values after the last step of the parameters this rank's stages hold.
    Returns their names (the caller checks that the ranks hold every parameter between them)."""
    def full(t):
        return t.full_tensor() if hasattr(t, "full_tensor") else t

    opt = torch.optim.AdamW(module.parameters(), lr=LR, eps=EPS)
    for step in range(steps):
        opt.zero_grad()
        loss = module.train_step(*inputs)
        torch.testing.assert_close(loss, ref.losses[step], rtol=RTOL, atol=ATOL,
                                   msg=lambda m: f"rank {rank} step {step} loss: {m}")
        if step == 0:
            for n, p in module.named_parameters():
                assert p.grad is not None, f"{n} got no gradient"
                torch.testing.assert_close(full(p.grad), ref.grads[n], rtol=RTOL, atol=ATOL,
                                           msg=lambda m, n=n: f"rank {rank} grad {n}: {m}")
        opt.step()
    for n, p in module.named_parameters():
        torch.testing.assert_close(full(p.detach()), ref.params[n], rtol=RTOL, atol=PARAM_ATOL,
                                   msg=lambda m, n=n: f"rank {rank} param {n} after {steps}: {m}")
    return [n for n, _ in module.named_parameters()]
