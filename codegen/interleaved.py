"""Interleaved 1F1B: the traced graph cut into ``v * p`` stages over ``p`` ranks, rank ``r``
holding stages ``r, r + p, r + 2p, ...`` (Narayanan et al. 2021, section 2.2), run by
``torch.distributed.pipelining.ScheduleInterleaved1F1B`` over this rank's ``PipelineStage``s.

Each rank's stages are cut and built as for one stage per rank (``stage_split.py``); the module a
rank returns holds all of its stages' parameters under the model's own names (the stage modules'
leaf modules placed at their paths in one tree, containers made fresh), so an optimizer over
``module.parameters()`` steps exactly this rank's share. Every rank passes the whole batch; the
model's inputs reach every stage by keyword (the first stage's placeholders are named as the
model's inputs), which is how a rank holding the first stage and a later one feeds both.
One device per stage (stages sharded over several devices: ``pipeline.py``'s one-stage path).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn

from .pipeline_step import run_step
from .stage_split import build_stage_modules, check_stages, split_stages

SCHEDULE = "interleaved-1f1b"


def _place(root: nn.Module, path: str, module: nn.Module) -> None:
    """``module`` at ``path`` under ``root``, with fresh containers on the way."""
    *outer, last = path.split(".")
    at = root
    for name in outer:
        nxt = getattr(at, name, None)
        if not isinstance(nxt, nn.Module):
            nxt = nn.Module()
            at.add_module(name, nxt)
        at = nxt
    if getattr(at, last, None) is not module:
        at.add_module(last, module)


def merge_stages(root: nn.Module, stages: Sequence[fx.GraphModule]) -> None:
    """Every parameter and buffer of ``stages`` reachable from ``root`` under its own name: each
    tensor's owning module placed at its path (a tensor on a stage module itself on ``root``)."""
    for stage in stages:
        for kind, items in (("parameter", stage.named_parameters()), ("buffer", stage.named_buffers())):
            for name, t in items:
                path, _, leaf = name.rpartition(".")
                if path:
                    _place(root, path, stage.get_submodule(path))
                elif kind == "parameter":
                    root.register_parameter(leaf, t)
                else:
                    root.register_buffer(leaf, t)


class InterleavedModule(nn.Module):
    """This rank's ``v`` stages of an interleaved 1F1B pipeline; trains via ``train_step``."""

    def __init__(self, modules: list[fx.GraphModule], indices: list[int], num_stages: int, input_names: list[str],
                 microbatches: int, loss_rank: int, loss_meta: torch.Tensor, group, device: torch.device,
                 loss_reduction: str = "mean"):
        super().__init__()
        from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

        merge_stages(self, modules)
        self.stage_indices, self.num_stages = list(indices), num_stages
        self.input_names = list(input_names)
        self.microbatches, self.schedule_name, self.loss_reduction = microbatches, SCHEDULE, loss_reduction
        self._loss_rank, self._group, self._device, self._loss_meta = loss_rank, group, device, loss_meta
        self._stages = [PipelineStage(m, i, num_stages, device, group=group) for m, i in zip(modules, indices)]
        self._schedule = ScheduleInterleaved1F1B(self._stages, microbatches, loss_fn=_output_is_loss,
                                                 scale_grads=loss_reduction == "mean")

    @property
    def is_last(self) -> bool:
        return self.num_stages - 1 in self.stage_indices

    def train_step(self, *inputs) -> torch.Tensor:
        """One full-batch forward and backward through the schedule; the loss, on every rank."""
        return self._run(self._schedule.step, inputs)

    def forward(self, *inputs) -> torch.Tensor:
        with torch.no_grad():
            return self._run(self._schedule.eval, inputs)

    def _run(self, run, inputs: tuple) -> torch.Tensor:
        return run_step(self, run, inputs, positional=False)


def _output_is_loss(output: torch.Tensor, target: Any) -> torch.Tensor:
    return output


class _ContiguousGrad(torch.autograd.Function):
    """Identity forward; the gradient made contiguous on its way back."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g.contiguous()


def contiguous_grad(x: torch.Tensor) -> torch.Tensor:
    return _ContiguousGrad.apply(x) if x.requires_grad else x


def contiguous_sends(part) -> None:
    """What crosses a cut made contiguous both ways: c10d sends and receives only contiguous
    buffers, and a cut may fall after a transpose (the activation sent) or before one (the
    gradient sent back, whose layout torch's pipelining also takes for its receive buffers)."""
    graph = part.graph
    received = [n for n in graph.nodes if n.op == "placeholder" and n.name in set(part.carried_in)]
    for ph in received:
        users = list(ph.users)
        with graph.inserting_after(received[-1]):
            node = graph.call_function(contiguous_grad, (ph,))
        for u in users:
            u.replace_input_with(ph, node)
    out = next(n for n in graph.nodes if n.op == "output")
    if part.carried_out:
        with graph.inserting_before(out):
            sent = tuple(graph.call_method("contiguous", (a,)) for a in out.args[0])
        out.args = (sent,)


def interleaved_module(model: nn.Module, plan, example_inputs: tuple, graph, group, device: torch.device,
                       loss_reduction: str, loss_meta: torch.Tensor) -> InterleavedModule:
    """This rank's stages of a plan of ``v * p`` one-device stages on ``p`` ranks (``pipeline_module``
    checks the rest); one-line ValueErrors for a plan that cannot run interleaved."""
    from torch.distributed.distributed_c10d import get_global_rank

    world, rank = dist.get_world_size(group), dist.get_rank(group)
    count = len(plan.stages)
    if any(int(getattr(s, "devices", 1)) != 1 for s in plan.stages):
        raise ValueError("interleaved 1F1B runs stages of one device each: plan the stages on one device, "
                         "or run schedule='1f1b'")
    if count % world or count // world < 2:
        raise ValueError(f"interleaved 1F1B needs a multiple (at least 2) of the {world} ranks' count of "
                         f"stages, one every {world} stages per rank; the plan has {count}")
    microbatches = int(plan.microbatches)
    if microbatches % max(1, microbatches // world):
        raise ValueError(f"interleaved 1F1B on {world} ranks runs microbatches in rounds of {world}: "
                         f"{microbatches} microbatches do not split into them")
    stages = check_stages(plan.stages, [n.name for n in graph.nodes])
    gm = graph.fx_graph
    parts = split_stages(gm, stages, example_inputs)
    for part in parts:
        contiguous_sends(part)
    modules = build_stage_modules(model, parts)
    mine = list(range(rank, count, world))
    input_names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    return InterleavedModule([modules[i].to(device) for i in mine], mine, count, input_names, microbatches,
                             get_global_rank(group or dist.group.WORLD, (count - 1) % world), loss_meta,
                             group, device, loss_reduction)
