"""``autopar.compile_many``: many models planned and scheduled together, then trained.

The plan (``autopar.planning.many``) fuses siblings where the cost model predicts it faster,
gives every job a device count and schedules the jobs' units on the devices. Training follows
that schedule on local gloo processes (``autopar.runtime.many_run``): a job on one device trains there;
a job on several trains data-parallel on their process subgroup (torch's
DistributedDataParallel, the batch split evenly); a job whose next unit runs elsewhere has its
module and optimizer state sent there first. Every model trains exactly the steps it would
alone, so its losses match a solo run (``solo()``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch.nn as nn

from autopar.core.cluster import Cluster
from autopar.core.resolve import resolve_cluster
from autopar.planning.many import ManyPlan, plan_many
from autopar.runtime.many_run import OPTIMIZERS, make_optimizer



@dataclass
class ManyModels:
    """The plan and what training needs; ``train()`` runs it, ``solo()`` is the reference."""

    plan: ManyPlan
    models: list[nn.Module]
    inputs: list[tuple]
    optimizer: str | Callable
    hparams: list[dict]

    def report(self) -> str:
        return self.plan.report()

    def train(self, timeout: float | None = 600.0) -> list[list[float]]:
        """Every model's loss at every step, trained by the plan on ``plan.devices`` processes.

        Under an initialized process group of that size this rank does its share (all ranks
        return the losses); otherwise local gloo processes are started for it."""
        import torch.distributed as dist

        from autopar.runtime.many_run import run_rank

        if dist.is_available() and dist.is_initialized():
            if dist.get_world_size() != self.plan.devices:
                raise ValueError(f"the plan is for {self.plan.devices} processes, the process group has "
                                 f"{dist.get_world_size()}")
            return run_rank(self)
        from autopar.runtime.launch import launch

        return launch(_worker, self.plan.devices, self, timeout=timeout)[0]

    def solo(self) -> list[list[float]]:
        """Every model trained alone in this process, the same steps: the losses to compare with."""
        out = []
        for i, model in enumerate(self.models):
            m = copy.deepcopy(model)
            opt = make_optimizer(self.optimizer, m.parameters(), self.hparams[i])
            losses = []
            for _ in range(self.plan.steps):
                opt.zero_grad()
                loss = m(*self.inputs[i])
                loss.backward()
                opt.step()
                losses.append(loss.item())
            out.append(losses)
        return out


def _worker(rank: int, world: int, many: ManyModels):
    from autopar.runtime.many_run import run_rank

    return run_rank(many)


def compile_many(models, devices, example_inputs, *, steps: int = 20, optimizer: str | Callable = "adamw",
                 hparams: list[dict] | dict | None = None, cluster: Cluster | str | None = None,
                 cost_model: str | None = None, fuse: bool | int | str = "auto", units: int = 4,
                 names: list[str] | None = None, parallel: str | None = None, time_limit: float = 10.0
                 ) -> ManyModels:
    """Plan ``models`` together on ``devices`` and return what trains them (see the module docstring).

    ``example_inputs``: one tuple every model trains on, or one tuple per model.
    ``optimizer``: "adamw", "adam", "sgd" (fusable), or any ``callable(params, **hparams)``
    returning a torch optimizer (those models are not fused). ``hparams``: one dict for all or one
    per model (``lr``, ``weight_decay``, ``betas``, ...). ``cluster``: what the plan prices
    (``autopar.core.resolve``; default: the local machine, the ``cpu`` preset with ``devices`` processes,
    priced by the profiled cost model).
    """
    from autopar.runtime.launch import exit_if_bootstrapping

    exit_if_bootstrapping()  # a rank re-running an unguarded script: no second plan, no second report
    models = list(models)
    if isinstance(devices, Cluster):
        if cluster is not None:
            raise ValueError("compile_many: devices is already a Cluster; drop cluster=")
        cluster, devices = devices, devices.devices
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices must be a positive int or an autopar.Cluster, not {devices!r}")
    cluster = resolve_cluster(cluster, devices)
    if cost_model is None:
        cost_model = "profiled" if cluster.name.startswith("cpu") else "analytic"
    if isinstance(optimizer, str) and optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)} or a callable, not {optimizer!r}")
    hp = _hparams(hparams, len(models))
    from autopar.planning.many import per_model_inputs

    inputs = per_model_inputs(models, example_inputs)
    plan = _plan_once(models, inputs, cluster, steps=steps, units=units, cost_model=cost_model,
                      optimizer=optimizer if isinstance(optimizer, str) else None, fuse=fuse,
                      parallel=parallel or ("ddp" if cluster.name.startswith("cpu") else "autopar"),
                      names=names, time_limit=time_limit)
    return ManyModels(plan, models, inputs, optimizer, hp)


def _hparams(hparams, n: int) -> list[dict]:
    if hparams is None:
        return [{} for _ in range(n)]
    if isinstance(hparams, dict):
        return [dict(hparams) for _ in range(n)]
    hparams = [dict(h) for h in hparams]
    if len(hparams) != n:
        raise ValueError(f"hparams: {len(hparams)} dicts for {n} models; give one per model or one for all")
    return hparams


def _plan_once(models, inputs, cluster, **kwargs) -> ManyPlan:
    """Plan on one rank and share it: measured cost models may differ a little between ranks,
    and every rank must follow the same schedule."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return plan_many(models, inputs, cluster, **kwargs)
    box = [plan_many(models, inputs, cluster, **kwargs) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
