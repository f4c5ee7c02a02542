"""A few training steps of a compiled module, beside the same steps of the unsplit model on one process.

This is what the examples, ``autopar run`` and ``make demo`` show: the sharded module is only
worth running if it trains with the same numbers as the single-device model, so every one of them
prints the two loss columns side by side and says how far apart they are.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from autopar.codegen.module import CompiledModule, training_loss
from autopar.parallel_module import ParallelModule

# Adam's eps: with the default 1e-8, a gradient that is zero in exact arithmetic (rounding noise
# of 1e-9 in one run, 0 in the other) takes a full lr-sized step of either sign; 1e-6 keeps such
# noise from deciding a step while leaving ordinary gradients (>> 1e-6) unaffected.
ADAM_EPS = 1e-6
RTOL = 1e-4  # per-step losses of the two runs agree to float32 rounding, accumulated over steps


def optimizer(module: nn.Module, lr: float) -> torch.optim.Optimizer:
    """AdamW as the module's plan trains with it: a compiled module's own (under ZeRO it steps only
    this rank's slices; a plain AdamW would find no gradient on the parameters, or, under ZeRO-3,
    no parameters)."""
    if isinstance(module, (CompiledModule, ParallelModule)):
        return module.optimizer(torch.optim.AdamW, lr=lr, eps=ADAM_EPS)
    return torch.optim.AdamW(module.parameters(), lr=lr, eps=ADAM_EPS)


def train_steps(module: nn.Module, inputs, steps: int = 3, lr: float = 1e-3, kwargs=None, *, opt=None,
                after_step=None) -> list[float]:
    """``steps`` AdamW steps of a module whose forward returns the loss (a scalar, or an output
    with a ``loss``); the loss of each step. A compiled module's ``train_step`` runs forward and
    backward whatever its plan. ``opt``: the optimizer to step (default a fresh AdamW);
    ``after_step(k)`` is called after step k (0-based), e.g. to save a checkpoint."""
    opt = opt if opt is not None else optimizer(module, lr)
    kwargs = kwargs or {}
    losses = []
    for k in range(steps):
        opt.zero_grad()
        if hasattr(module, "train_step"):
            loss = module.train_step(*inputs, **kwargs)
        else:
            loss = training_loss(module(*inputs, **kwargs))
            loss.backward()
        opt.step()
        losses.append(loss.detach().item())
        if after_step is not None:
            after_step(k)
    return losses


def single_process_losses(model: nn.Module, inputs, steps: int = 3, lr: float = 1e-3, kwargs=None,
                          after_step=None) -> list[float]:
    """The same steps on an unsplit copy of ``model`` (the model itself is left untouched);
    ``after_step(k)`` as in ``train_steps`` (a progress bar)."""
    return train_steps(copy.deepcopy(model), inputs, steps, lr, kwargs, after_step=after_step)


@dataclass
class LossComparison:
    sharded: list[float]
    single: list[float]
    devices: int
    first: int = 0  # the step the first loss is of (a resumed run's)

    @property
    def max_relative_difference(self) -> float:
        return max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(self.sharded, self.single)), default=0.0)

    @property
    def diverged(self) -> str:
        """'' while every loss is finite; else which run first went to nan/inf, and at which step."""
        for k, (a, b) in enumerate(zip(self.sharded, self.single)):
            if not (math.isfinite(a) and math.isfinite(b)):
                return (f"the losses diverged: not finite ({a:g} with {self.devices} processes, {b:g} on 1 process) "
                        f"from step {k}: the runs cannot be compared; lower --lr")
        return ""

    @property
    def equal(self) -> bool:
        return (len(self.sharded) == len(self.single) and not self.diverged
                and self.max_relative_difference <= RTOL)

    def table(self) -> str:
        head = f"{'step':>4}  {f'loss, {self.devices} processes (autopar)':>32}  {'loss, 1 process':>16}  {'rel. diff':>9}"
        rows = [head]
        for k, (a, b) in enumerate(zip(self.sharded, self.single)):
            rows.append(f"{k + self.first:>4}  {a:>32.7f}  {b:>16.7f}  {abs(a - b) / max(abs(b), 1e-12):>9.1e}")
        if self.diverged:
            rows.append("diverged: " + self.diverged.split(": ", 1)[1].split(": the runs")[0])
            return "\n".join(rows)
        verdict = "equal" if self.equal else "DIFFERENT"
        rows.append(f"{verdict}: largest relative difference {self.max_relative_difference:.1e} "
                    f"(float32 rounding allows {RTOL:g})")
        return "\n".join(rows)


def run_worker(rank: int, world: int, spec: str, steps: int, lr: float, plan_doc: dict, saving=None) -> tuple:
    """One rank of ``autopar run``: compile MODEL ``spec`` with the plan its parent made (or read)
    and train it, resuming from and saving checkpoints as ``saving`` (a ``run_setup.Checkpointing``)
    says; autopar's one-line errors come back as text.

    Returns ``("ok", losses)`` or ``("error", message)`` for autopar's own one-line errors, which
    every rank raises alike.
    """
    from autopar import compile as compile_model, load_checkpoint, save_checkpoint
    from autopar.core.errors import AutoparError
    from autopar.cli.model_spec import load_call
    from autopar.planning.plan import Plan

    try:
        model, inputs, kwargs, _ = load_call(spec)
        module = compile_model(model, world, inputs, example_kwargs=kwargs, plan=Plan.from_json(plan_doc))
        opt = optimizer(module, lr)
        start = 0
        if saving is not None and saving.resume:
            start = load_checkpoint(saving.folder, module, opt)

        def after_step(k: int) -> None:
            if saving is not None and saving.due(start + k + 1, start + steps):
                save_checkpoint(saving.folder, module, opt, step=start + k + 1)

        return ("ok", train_steps(module, inputs, steps, lr, kwargs, opt=opt, after_step=after_step))
    except (AutoparError, ValueError) as e:
        return ("error", str(e))
