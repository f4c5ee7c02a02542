"""One rank's share of a many-model schedule (``ManyModels.train``).

Every rank walks the same global order of events, the schedule's units by start time: before a
unit whose devices differ from its job's previous unit, the previous unit's first rank sends the
job's module and optimizer state to the ranks that lack it; then the unit's ranks train its
steps (one rank alone, or data-parallel over their subgroup). Each blocking exchange (a send and
its receive, a subgroup's all-reduce) is met by all of its ranks at the same place of that one
order, so no rank waits on one that waits on it. The lowest rank of each unit records the losses;
at the end they are gathered so that every rank returns all models' losses.
"""

from __future__ import annotations

import copy
import gc
import inspect
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

OPTIMIZERS = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}


def optimizer_defaults(name: str) -> dict[str, Any]:
    cls = getattr(torch.optim, OPTIMIZERS[name])
    return {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty and k not in ("foreach", "maximize", "capturable",
                                                                       "differentiable", "fused")}


def make_optimizer(optimizer, params, hparams: dict):
    """A torch optimizer by name (adamw, adam, sgd) with ``hparams``, or ``optimizer(params, **hparams)``."""
    if callable(optimizer):
        return optimizer(params, **hparams)
    return getattr(torch.optim, OPTIMIZERS[optimizer])(params, **hparams)


def make_fused_optimizer(name: str, params, k: int, hparams: list[dict]):
    """The fused optimizer over K models with each model's own hyper-parameters (torch's defaults
    where a model gives none, so it steps as ``torch.optim.<name>`` would)."""
    from autopar.fusion import FusedAdamW, FusedSGD

    merged = [{**optimizer_defaults(name), **hp} for hp in hparams]
    per = (lambda key: [m[key] for m in merged])
    if name in ("adamw", "adam"):
        if any(m.get("amsgrad") for m in merged):
            raise ValueError("the fused optimizer has no amsgrad; train these models unfused (fuse=False)")
        return FusedAdamW(params, k, lr=per("lr"), betas=[tuple(b) for b in per("betas")], eps=per("eps"),
                          weight_decay=per("weight_decay"), decoupled=(name == "adamw"))
    nesterov = {bool(m["nesterov"]) for m in merged}
    if len(nesterov) > 1:
        raise ValueError("fused SGD needs one nesterov setting for all models of a group")
    return FusedSGD(params, k, lr=per("lr"), momentum=per("momentum"), dampening=per("dampening"),
                    weight_decay=per("weight_decay"), nesterov=nesterov.pop())


def _build(many, job):
    """A job's module and optimizer, made alike on every rank from the models given."""
    from autopar.planning.many import job_module

    models = [copy.deepcopy(m) for m in many.models]
    module, data = job_module(models, many.inputs, job)
    if job.fused:
        opt = make_fused_optimizer(many.optimizer, module.parameters(), len(job.models),
                                   [many.hparams[i] for i in job.models])
    else:
        opt = make_optimizer(many.optimizer, module.parameters(), many.hparams[job.models[0]])
    return module, opt, data


def _share(data: tuple, devices: tuple[int, ...], rank: int, batch_dim: int) -> tuple:
    """This rank's even slice of the batch (every tensor input along ``batch_dim``)."""
    g, i = len(devices), devices.index(rank)
    out = []
    for x in data:
        if isinstance(x, torch.Tensor) and x.dim() > batch_dim:
            n = x.shape[batch_dim] // g
            out.append(x.narrow(batch_dim, i * n, n))
        else:
            out.append(x)
    return tuple(out)


def run_rank(many) -> list[list[float]]:
    plan = many.plan
    rank = dist.get_rank()
    schedule = plan.joint
    order = sorted(schedule.slots, key=lambda s: (s.start, s.job, s.unit))
    # every rank creates every subgroup, in one order (new_group is collective over the world)
    groups = {d: dist.new_group(list(d)) for d in sorted({s.devices for s in order if len(s.devices) > 1})}
    per_unit = plan.steps // plan.units
    held: dict[int, tuple] = {}  # job -> (module, optimizer, data) on this rank
    wrapped: dict[tuple, DistributedDataParallel] = {}
    last: dict[int, tuple[int, ...]] = {}
    records: list[tuple[list[int], int, list[float]]] = []
    for slot in order:
        job = plan.jobs[slot.job]
        devices = slot.devices
        before = last.get(slot.job)
        if before is None:
            if rank in devices:
                held[slot.job] = _build(many, job)
        elif set(before) != set(devices):
            _move(many, job, slot.job, before, devices, rank, held)
        last[slot.job] = devices
        if rank not in devices:
            continue
        module, opt, data = held[slot.job]
        net = module
        if len(devices) > 1:
            key = (slot.job, devices, id(module))
            if key not in wrapped:
                wrapped[key] = DistributedDataParallel(module, process_group=groups[devices])
            net = wrapped[key]
            data = _share(data, devices, rank, 1 if job.fused and job.inputs == "stacked" else 0)
        for step in range(slot.unit * per_unit, (slot.unit + 1) * per_unit):
            opt.zero_grad()
            loss = net(*data)
            (loss.sum() if job.fused else loss).backward()
            opt.step()
            value = loss.detach().reshape(-1).clone()
            if len(devices) > 1:  # each rank's loss is its half's mean: the batch's is their mean
                dist.all_reduce(value, group=groups[devices])
                value /= len(devices)
            if rank == devices[0]:
                records.append((job.models, step, value.tolist()))
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, records)
    # torn down here, in order (DDP's reducers, then the subgroups they use), not left to the
    # interpreter's exit after the default group is gone
    wrapped.clear()
    held.clear()
    gc.collect()
    for group in groups.values():
        dist.destroy_process_group(group)
    losses = [[float("nan")] * plan.steps for _ in plan.names]
    for part in gathered:
        for members, step, values in part:
            for m, v in zip(members, values):
                losses[m][step] = v
    return losses


def _move(many, job, index: int, before, devices, rank: int, held: dict) -> None:
    """Send the job's state from its previous unit's first rank to the ranks that lack it."""
    sender = before[0]
    receivers = [d for d in devices if d not in before]
    if rank == sender:
        module, opt, _ = held[index]
        state = {"module": module.state_dict(), "optimizer": opt.state_dict()}
        for dst in receivers:
            dist.send_object_list([state], dst=dst)
    if rank in receivers:
        box = [None]
        dist.recv_object_list(box, src=sender)
        module, opt, data = _build(many, job)
        module.load_state_dict(box[0]["module"])
        opt.load_state_dict(box[0]["optimizer"])
        held[index] = (module, opt, data)
    if rank in before and rank not in devices:
        held.pop(index, None)  # the job lives on elsewhere now
