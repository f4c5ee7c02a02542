"""One optimizer step for K fused models, each with its own hyper-parameters.

Every parameter of a fused module holds K models' values model-major (viewed as (K, -1), row k
is model k's); a hyper-parameter given per model (a list of K values) becomes a (K, 1) column
that scales each model's row, so the K updates run as one set of kernels. The arithmetic follows torch.optim's single-tensor
AdamW / Adam / SGD step by step (the same scalars computed in double precision, then applied
per model), so a fused run matches K separate torch.optim runs to float32 rounding.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch


def _per_model(value, k: int, name: str) -> list[float]:
    if isinstance(value, (int, float)):
        return [float(value)] * k
    values = [float(v) for v in value]
    if len(values) != k:
        raise ValueError(f"{name}: {len(values)} values for {k} fused models; give one per model or one for all")
    return values


def _pairs(value, k: int, name: str) -> list[tuple[float, float]]:
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value):
        return [(float(value[0]), float(value[1]))] * k
    pairs = [tuple(map(float, v)) for v in value]
    if len(pairs) != k or any(len(p) != 2 for p in pairs):
        raise ValueError(f"{name}: give one (beta1, beta2) pair, or one per model ({k})")
    return pairs


def _column(values: Sequence[float], p: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=p.dtype, device=p.device).reshape(len(values), 1)


def _rows(p: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(parameter, gradient) as (K, -1) views: row k is model k's."""
    if p.numel() % k or not p.is_contiguous():
        raise ValueError(f"a parameter of shape {tuple(p.shape)} does not hold {k} models' values contiguously")
    return p.view(k, -1), p.grad.reshape(k, -1)


def _closure_loss(closure):
    """torch.optim's closure protocol: re-evaluate the loss with gradients on, if given."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def _check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be >= 1, not {k}")


class FusedAdamW(torch.optim.Optimizer):
    """AdamW (``decoupled=True``, torch.optim.AdamW) or Adam (``False``) over K fused models.

    ``lr``, ``weight_decay``, ``eps``: one value or K; ``betas``: one pair or K pairs.
    """

    def __init__(self, params, k: int, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 decoupled: bool = True):
        _check_k(k)
        defaults = dict(lr=_per_model(lr, k, "lr"), betas=_pairs(betas, k, "betas"), eps=_per_model(eps, k, "eps"),
                        weight_decay=_per_model(weight_decay, k, "weight_decay"), decoupled=decoupled, k=k)
        if any(v < 0 for v in defaults["lr"]) or any(not (0 <= b < 1) for pair in defaults["betas"] for b in pair):
            raise ValueError("lr must be >= 0 and betas in [0, 1)")
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = _closure_loss(closure)
        for group in self.param_groups:
            k, lrs, wds, eps = group["k"], group["lr"], group["weight_decay"], group["eps"]
            b1s, b2s = [b[0] for b in group["betas"]], [b[1] for b in group["betas"]]
            columns: dict = {}  # (step, dtype, device) -> this step's per-model factors, made once

            def factors(step: int, p: torch.Tensor) -> dict:
                key = (step, p.dtype, p.device)
                if key not in columns:
                    col = (lambda values: _column(values, p))
                    columns[key] = dict(
                        decay=col([1 - lr * wd for lr, wd in zip(lrs, wds)]), wd=col(wds),
                        one_minus_b1=col([1 - b for b in b1s]), b2=col(b2s), one_minus_b2=col([1 - b for b in b2s]),
                        step_size=col([lr / (1 - b1 ** step) for lr, b1 in zip(lrs, b1s)]),
                        bc2_sqrt=col([math.sqrt(1 - b2 ** step) for b2 in b2s]), eps=col(eps))
                return columns[key]

            for param in group["params"]:
                if param.grad is None:
                    continue
                p, grad = _rows(param, k)
                state = self.state[param]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                f = factors(state["step"], p)
                if group["decoupled"]:
                    if any(wds):
                        p.mul_(f["decay"])
                elif any(wds):
                    grad = grad.add(p * f["wd"])
                state["exp_avg"].lerp_(grad, f["one_minus_b1"])
                state["exp_avg_sq"].mul_(f["b2"]).addcmul_(grad, grad * f["one_minus_b2"])
                denom = (state["exp_avg_sq"].sqrt() / f["bc2_sqrt"]).add_(f["eps"])
                p.sub_(state["exp_avg"] / denom * f["step_size"])
        return loss


class FusedSGD(torch.optim.Optimizer):
    """torch.optim.SGD over K fused models: ``lr``, ``momentum``, ``dampening``, ``weight_decay``
    one value or K; ``nesterov`` for all."""

    def __init__(self, params, k: int, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov: bool = False):
        _check_k(k)
        defaults = dict(lr=_per_model(lr, k, "lr"), momentum=_per_model(momentum, k, "momentum"),
                        dampening=_per_model(dampening, k, "dampening"),
                        weight_decay=_per_model(weight_decay, k, "weight_decay"), nesterov=nesterov, k=k)
        if nesterov and any(m <= 0 for m in defaults["momentum"]):
            raise ValueError("nesterov needs momentum > 0 for every model")
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = _closure_loss(closure)
        for group in self.param_groups:
            lrs, moms, wds = group["lr"], group["momentum"], group["weight_decay"]
            # torch ignores dampening where there is no momentum: the buffer is then the gradient
            damps = [d if m != 0 else 0.0 for d, m in zip(group["dampening"], moms)]
            for param in group["params"]:
                if param.grad is None:
                    continue
                p, d_p = _rows(param, group["k"])
                if any(wds):
                    d_p = d_p.add(p * _column(wds, p))
                if any(moms):
                    state = self.state[param]
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = state["momentum_buffer"] = d_p.detach().clone()
                    else:
                        buf.mul_(_column(moms, p)).add_(d_p * _column([1 - d for d in damps], p))
                    d_p = d_p + buf * _column(moms, p) if group["nesterov"] else buf
                p.sub_(d_p * _column(lrs, p))
        return loss
