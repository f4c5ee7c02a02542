"""The one kind of module ``autopar.compile`` returns, for any device count.

``ParallelModule`` holds what runs: with one device the model itself (a copy), with several this
rank's compiled module (``codegen/module.py``: DTensor parameters, the generated program) or its
pipeline stage. Its children, parameters and buffers are those of what runs, under the model's
names, so optimizers, state dicts and checkpoints see the model's structure whatever the plan.

Planned ahead (``compile`` with example inputs) it holds the compiled module from the start.
Without example inputs it plans at its first call, with that call's batch, as ``torch.compile``
compiles at the first call. Until then it holds a copy of the model; with several devices its
parameters are DTensors replicated over the ranks, and at the first call these very objects
become the compiled module's parameters (``torch.utils.swap_tensors`` gives each its planned
layout and value), so an optimizer built before the first call steps what runs, as with
``torch.compile``, whose module keeps the model's parameters. The usual loop works:

    module = autopar.compile(model, devices)
    opt = torch.optim.AdamW(module.parameters())   # before the first call: the same objects after it
    loss = module(x, y); loss.backward(); opt.step()

``module.optimizer(cls, ...)`` before the first call is ``cls`` over those parameters, stepping
their local shards (``codegen/local_step.py``); a plan that turns out to need another optimizer
(ZeRO slices the optimizer state, a pipeline stage holds other parameters than the model's) is
then refused at the first call in one line, never trained wrong. ``module.plan``, ``module.code``
and the plan's other attributes exist from the first call; before it, reading one says why not.
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn

from autopar.core.errors import AutoparError


class NotPlannedYet(AutoparError, AttributeError):
    """An attribute that only the plan makes, read before the first call planned it."""


class ParallelModule(nn.Module):
    """This rank's module for training a model under an autopar plan (see the module docstring)."""

    def __init__(self, model: nn.Module, build: Callable, devices: int, what: str = "the model",
                 example: tuple[tuple, dict | None] | None = None):
        """``build(model, args, kwargs, keep)`` -> (the module that runs, or None for a copy of the
        model; the plan); ``example``: (args, kwargs) to plan and build now, else at the first call."""
        super().__init__()
        self.__dict__["_build_fn"] = build
        self.__dict__["_devices"] = devices
        self.__dict__["_what"] = what
        self.__dict__["_inner"] = None
        self.__dict__["_plan"] = None
        self.__dict__["_early_optimizer"] = False
        self.__dict__["_source"] = None  # before the first call: the plain model that is planned
        if example is None:  # the user's model is never changed
            self.__dict__["_source"] = copy.deepcopy(model)
            self._hold(_replicated(copy.deepcopy(model)) if devices > 1 else self._source)
            return
        inner, plan = build(model, example[0], example[1], None)  # codegen copies the model
        inner = copy.deepcopy(model) if inner is None else inner
        self.__dict__["_plan"] = plan
        self.__dict__["_inner"] = inner
        self._hold(inner)

    # -- what runs, and building it ----------------------------------------------------------

    def _hold(self, target: nn.Module) -> None:
        """Take ``target``'s children, parameters and buffers as this module's own."""
        self._modules.clear()
        self._parameters.clear()
        self._buffers.clear()
        for name, child in target.named_children():
            self._modules[name] = child
        for name, p in target.named_parameters(recurse=False):
            self._parameters[name] = p
        for name, b in target.named_buffers(recurse=False):
            self._buffers[name] = b
        self.__dict__["_target"] = target

    def materialize(self, *args, **kwargs) -> "ParallelModule":
        """Plan and build now for a call with these inputs (what the first call does); returns self."""
        if self._inner is None:
            held, source = self._target, self._source
            keep = None
            if held is not source:  # the values held now (set or loaded since compile) are what is planned
                _copy_values(held, source)
                keep = dict(nn.Module.named_parameters(held, remove_duplicate=False))
            inner, plan = self._build_fn(source, args, kwargs, keep,
                                         early_optimizer=self._early_optimizer and self._devices > 1)
            if inner is None:  # one device: the model itself runs
                inner = source
            self.__dict__["_plan"] = plan
            self.__dict__["_inner"] = inner
            self.__dict__["_source"] = None
            self._hold(inner)
            self._check_early_optimizer(plan, inner)  # built either way: the next call runs
        return self

    def _check_early_optimizer(self, plan, inner: nn.Module) -> None:
        if not self._early_optimizer or self._devices == 1:
            return
        options = inner.__dict__.get("training")  # a compiled module's: the training options it runs
        zero = getattr(options, "zero", 0)
        if plan.stages or zero:
            why = "is pipelined (each stage holds its own parameters)" if plan.stages else \
                f"uses ZeRO-{zero} (the optimizer state is sliced over ranks)"
            raise ValueError(f"the plan made at the first call {why}, so an optimizer built before that call "
                             "cannot train it: build it now (module.optimizer(...)) and call again, or pass "
                             "example_inputs to autopar.compile to plan ahead")

    def __call__(self, *args, **kwargs):
        # The first call plans before entering nn.Module.__call__: torch.fx patches that while it
        # traces, and ranks that are threads of one process (a threaded process group) trace in
        # turn, so one rank's call would otherwise land in another rank's trace.
        if self._inner is None:
            self.materialize(*args, **kwargs)
        return super().__call__(*args, **kwargs)

    def forward(self, *args, **kwargs):
        if self._inner is None:
            self.materialize(*args, **kwargs)
        return self._inner(*args, **kwargs)

    # -- the training interface, the same for every device count ------------------------------

    @property
    def plan(self):
        """The plan this module runs (made at the first call when no example inputs were given)."""
        if self._plan is None:
            raise self._not_yet("plan")
        return self._plan

    @property
    def planned(self) -> bool:
        """Whether the plan is made (at ``compile`` with example inputs, else at the first call)."""
        return self._plan is not None

    def train_step(self, *args, **kwargs) -> torch.Tensor:
        """Forward and backward of one batch; returns the detached loss; then ``optimizer.step()``."""
        if self._inner is None:
            self.materialize(*args, **kwargs)
        if self._devices > 1:
            return self._inner.train_step(*args, **kwargs)
        from autopar.codegen.module import training_loss

        loss = training_loss(self._inner(*args, **kwargs))
        loss.backward()
        return loss.detach()

    def optimizer(self, cls=torch.optim.AdamW, **kwargs) -> torch.optim.Optimizer:
        """The optimizer this module's plan trains with (``codegen/module.py``'s ``optimizer``);
        with one device, or on a pipeline stage without ZeRO, ``cls(module.parameters(), **kwargs)``."""
        if self._devices == 1:
            return cls(self.parameters(), **kwargs)
        if self._inner is not None:
            if hasattr(type(self._inner), "optimizer"):
                return self._inner.optimizer(cls, **kwargs)
            return cls(self.parameters(), **kwargs)  # a pipeline stage: torch's optimizer over its parameters
        import inspect

        from autopar.codegen.local_step import local_stepping

        self.__dict__["_early_optimizer"] = True
        if "foreach" in inspect.signature(cls).parameters:
            kwargs = {"foreach": True, **kwargs}
        return local_stepping(cls)(self.parameters(), **kwargs)

    def named_parameters(self, *args, **kwargs):
        self.__dict__["_early_optimizer"] |= self._inner is None  # an optimizer may be built on them
        return super().named_parameters(*args, **kwargs)

    def state_dict(self, *args, **kwargs):
        return self._target.state_dict(*args, **kwargs)  # the compiled module's hooks (ZeRO) run

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self._target.load_state_dict(state_dict, strict=strict, assign=assign)

    def train(self, mode: bool = True) -> "ParallelModule":
        super().train(mode)
        target = self._target
        if isinstance(target.__dict__.get("training"), bool):  # a compiled module's is its training options
            target.training = mode
        return self

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)  # parameters, buffers, children
        except AttributeError:
            pass
        inner = self.__dict__.get("_inner")
        if inner is None:
            if name.startswith("__") or name in ("_target", "_inner"):
                raise AttributeError(name)
            raise self._not_yet(name)
        return getattr(inner, name)

    def _not_yet(self, name: str) -> NotPlannedYet:
        return NotPlannedYet(f"module.{name} does not exist yet: autopar.compile plans {self._what} at its first "
                             "call, with that call's batch; call the module once (or pass example_inputs to "
                             "autopar.compile to plan ahead)")

    def extra_repr(self) -> str:
        if self._plan is None:
            return f"devices={self._devices}, planned at the first call"
        return f"devices={self._devices}, mesh={tuple(self._plan.mesh.shape) if self._plan.mesh else ()}"


def _replicated(model: nn.Module) -> nn.Module:
    """``model`` with every parameter a DTensor replicated over the process group's ranks (a tied
    one once): placeholders that ``swap_tensors`` can turn into the plan's DTensors, which a plain
    tensor cannot (a DTensor has slots a tensor lacks)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    cuda = any(p.device.type == "cuda" for p in model.parameters())
    mesh = init_device_mesh("cuda" if cuda else "cpu", (dist.get_world_size(),))
    made: dict[int, nn.Parameter] = {}
    for name, p in list(nn.Module.named_parameters(model, remove_duplicate=False)):
        if id(p) not in made:
            made[id(p)] = nn.Parameter(distribute_tensor(p.detach(), mesh, [Replicate()]),
                                       requires_grad=p.requires_grad)
        path, _, leaf = name.rpartition(".")
        (model.get_submodule(path) if path else model)._parameters[leaf] = made[id(p)]
    return model


@torch.no_grad()
def _copy_values(held: nn.Module, source: nn.Module) -> None:
    """``held``'s parameter and buffer values into ``source`` (whose tensors are plain)."""
    from torch.distributed.tensor import DTensor

    mine = dict(source.named_parameters(remove_duplicate=False))
    mine.update(source.named_buffers(remove_duplicate=False))
    theirs = dict(nn.Module.named_parameters(held, remove_duplicate=False))
    theirs.update(held.named_buffers(remove_duplicate=False))
    for name, t in theirs.items():
        value = t.to_local() if isinstance(t, DTensor) else t
        if mine[name] is not value:
            mine[name].copy_(value)
