"""Interleaved 1F1B: the traced graph cut into ``v * p`` stages over ``p`` ranks, rank ``r``
holding stages ``r, r + p, r + 2p, ...`` (Narayanan et al. 2021, section 2.2), run by
``torch.distributed.pipelining.ScheduleInterleaved1F1B`` over this rank's ``PipelineStage``s.

Each rank's stages are cut and built as for one stage per rank (``stage_split.py``); the module a
rank returns holds all of its stages' parameters under the model's own names (the stage modules'
leaf modules placed at their paths in one tree, containers made fresh), so an optimizer over
``module.parameters()`` steps exactly this rank's share. Every rank passes the whole batch; the
model's inputs reach every stage by keyword (the first stage's placeholders are named as the
model's inputs), which is how a rank holding the first stage and a later one feeds both.

Stages of ``d`` devices (data, tensor or context parallel inside each, as Llama 3 trains), or
trained with mixed precision, recomputation or ZeRO, run as one stage per rank runs them
(``pipeline._sharded_stage``): each of a rank's ``v`` stages a program on the stage's sub-mesh with
its own gradient reducer over the stage's data ranks, driven by ``split_backward.LeafStage``;
``p = world / d`` pipeline ranks, global rank ``r * d + i`` at place ``i`` of pipeline rank ``r``'s
sub-mesh, sending along the "pp" group of the ranks at place ``i`` of every sub-mesh.
"""

from __future__ import annotations

import gc
import math
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
    """This rank's ``v`` stages of an interleaved 1F1B pipeline; trains via ``train_step``.

    ``modules``: the stages' fx GraphModules (one device a stage), or their programs on the
    stages' sub-meshes (``module.CompiledModule``, run by ``split_backward.LeafStage``)."""

    def __init__(self, modules: list[nn.Module], indices: list[int], num_stages: int, input_names: list[str],
                 microbatches: int, loss_rank: int, loss_meta: torch.Tensor, group, device: torch.device,
                 loss_reduction: str = "mean"):
        super().__init__()
        from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

        from .module import CompiledModule
        from .split_backward import LeafStage

        merge_stages(self, modules)
        self.stage_indices, self.num_stages = list(indices), num_stages
        self.input_names = list(input_names)
        self.microbatches, self.schedule_name, self.loss_reduction = microbatches, SCHEDULE, loss_reduction
        self._loss_rank, self._group, self._device, self._loss_meta = loss_rank, group, device, loss_meta
        self._stages = [(LeafStage if isinstance(m, CompiledModule) else PipelineStage)(
            m, i, num_stages, device, group=group) for m, i in zip(modules, indices)]
        self._schedule = ScheduleInterleaved1F1B(self._stages, microbatches, loss_fn=_output_is_loss,
                                                 scale_grads=loss_reduction == "mean")

    @property
    def stage_modules(self) -> list[nn.Module]:
        """The stage modules this rank runs, in ``stage_indices``' order (they share its parameters)."""
        return [s.submod for s in self._stages]

    def optimizer(self, cls=torch.optim.AdamW, **kwargs):
        """``cls`` over this rank's stages' parameters; for programs on sub-meshes each stage's own
        (under ZeRO its sharded optimizer: ``zero.ShardedOptimizer``), stepped together."""
        if not all(hasattr(m, "optimizer") for m in self.stage_modules):
            return cls(self.parameters(), **kwargs)
        return StageOptimizers([m.optimizer(cls, **kwargs) for m in self.stage_modules])

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


class StageOptimizers:
    """One optimizer per stage of a rank, stepped (and zeroed) together as one."""

    def __init__(self, optimizers: list):
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for o in self.optimizers for g in o.param_groups]

    def state_numel(self) -> int:
        """Elements of optimizer state this rank holds."""
        return sum(o.state_numel() if hasattr(o, "state_numel") else
                   sum(v.numel() for s in o.state.values() for v in s.values()
                       if isinstance(v, torch.Tensor) and v.dim() > 0) for o in self.optimizers)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none)

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for o in self.optimizers:
            o.step()
        return loss

    def state_dict(self) -> dict:
        return {"stages": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state: dict) -> None:
        for o, s in zip(self.optimizers, state["stages"]):
            o.load_state_dict(s)


def check_rounds(count: int, ranks: int, microbatches: int) -> None:
    """One-line ValueErrors for ``count`` stages and ``microbatches`` that cannot run interleaved
    on ``ranks`` pipeline ranks."""
    if count % ranks or count // ranks < 2:
        raise ValueError(f"interleaved 1F1B needs a multiple (at least 2) of the {ranks} ranks' count of "
                         f"stages, one every {ranks} stages per rank; the plan has {count}")
    if microbatches % max(1, microbatches // ranks):
        raise ValueError(f"interleaved 1F1B on {ranks} ranks runs microbatches in rounds of {ranks}: "
                         f"{microbatches} microbatches do not split into them")


def pipeline_ranks(plan, world: int) -> int:
    """The pipeline ranks ``p = world / d`` of a plan of stages of ``d`` devices on ``world``
    processes, after checking that its stages run interleaved over them."""
    per_stage, devices = int(plan.stages[0].devices), math.prod(plan.mesh.shape)
    if world != devices or world % per_stage:
        raise ValueError(f"the plan runs on {devices} processes (stages of {per_stage} devices), but the "
                         f"process group has {world}: launch {devices}")
    check_rounds(len(plan.stages), world // per_stage, int(plan.microbatches))
    return world // per_stage


def interleaved_module(model: nn.Module, plan, example_inputs: tuple, graph, group, device: torch.device,
                       loss_reduction: str, loss_meta: torch.Tensor, shard=None) -> InterleavedModule:
    """This rank's stages of a plan of ``v * p`` stages on the ``p`` ranks of ``group``
    (``pipeline_module`` checks the rest); one-line ValueErrors for a plan that cannot run
    interleaved. ``shard(module, part, names)``: a stage's program on this rank's sub-mesh (then
    ``group`` is this rank's "pp" group); None: one device a stage, each run as cut."""
    from torch.distributed.distributed_c10d import get_global_rank

    world, rank = dist.get_world_size(group), dist.get_rank(group)
    count = len(plan.stages)
    microbatches = int(plan.microbatches)
    check_rounds(count, world, microbatches)
    stages = check_stages(plan.stages, [n.name for n in graph.nodes])
    gm = graph.fx_graph
    parts = split_stages(gm, stages, example_inputs)
    if shard is None:
        for part in parts:
            contiguous_sends(part)
    modules = build_stage_modules(model, parts)
    mine = list(range(rank, count, world))
    built = [modules[i].to(device) if shard is None else shard(modules[i], parts[i], stages[i]) for i in mine]
    del modules, parts
    input_names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    out = InterleavedModule(built, mine, count, input_names, microbatches,
                            get_global_rank(group or dist.group.WORLD, (count - 1) % world), loss_meta,
                            group, device, loss_reduction)
    gc.collect()  # the copy of the whole model the stages were cut from (``pipeline_module``)
    return out
