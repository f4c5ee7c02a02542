"""Pipeline stages: the traced graph cut into one submodule per stage, run by torch's pipelining.

The design notes (why it is built this way, what was checked) are in docs/codegen.md, "Pipeline stages".
"""

from __future__ import annotations

import dataclasses
import gc
import math
from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn

from .exported import fx_form
from .pipeline_step import run_step
from .stage_split import (HoldsTensor, StageGraph, build_stage_modules, check_stages, split_stages,  # noqa: F401
                          stage_boundary, stage_ir, stage_modules)

# the plan's schedule -> torch.distributed.pipelining's class; "zero-bubble" is ZB-H1, the
# interleaved zero-bubble schedule over one stage per rank (the backward split into input and
# weight gradients, the weight half run where 1F1B idles)
SCHEDULES = ("gpipe", "1f1b", "zero-bubble")
_MULTI = {"zero-bubble"}  # schedules that take a list of this rank's stages


def schedule_run(schedule: str, microbatches: int, stages: int) -> str:
    """The schedule a plan's stages run: 1F1B with fewer microbatches than stages runs as GPipe.

    With ``m < p`` microbatches every stage but the last ``m - 1`` starts all its forwards before
    its first backward under 1F1B too (its warm-up is ``min(m, p - k)`` forwards), and torch's
    ``Schedule1F1B`` takes no such count; GPipe's order computes the same gradients, and its last
    stages hold all ``m`` microbatches (``search.pipeline.in_flight`` prices that; the plan's
    report says so)."""
    if schedule == "1f1b" and microbatches < stages:
        return "gpipe"
    if schedule in _MULTI and microbatches < stages:
        raise ValueError(f"{schedule} needs at least as many microbatches as stages "
                         f"({microbatches} < {stages}): plan with more microbatches or schedule='gpipe'")
    return schedule


# -- the module that runs this rank's stage ----------------------------------------------------


def _output_is_loss(output: torch.Tensor, target: Any) -> torch.Tensor:
    """The schedule's ``loss_fn``: the last stage already computed the model's loss."""
    return output


class PipelinedModule(nn.Module):
    """This rank's pipeline stage, under the model's parameter names; trains via ``train_step``.

    Its children are the stage submodule's children, so ``named_parameters()`` lists exactly this
    stage's parameters with the original model's qualified names (other stages' parameters live
    on other ranks).
    """

    def __init__(self, stage_module: fx.GraphModule, stage_index: int, num_stages: int,
                 input_names: list[str], microbatches: int, schedule: str, loss_rank: int,
                 loss_meta: torch.Tensor, group: dist.ProcessGroup | None, device: torch.device,
                 loss_reduction: str = "mean", pp_group: dist.ProcessGroup | None = None):
        super().__init__()
        from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                                  ScheduleInterleavedZeroBubble)

        for name, child in stage_module.named_children():
            self.add_module(name, child)
        for name, p in stage_module.named_parameters(recurse=False):
            self.register_parameter(name, p)
        for name, b in stage_module.named_buffers(recurse=False):
            self.register_buffer(name, b)
        self.stage_index, self.num_stages = stage_index, num_stages
        self.input_names = list(input_names)
        self.microbatches, self.schedule_name = microbatches, schedule
        self.loss_reduction = loss_reduction
        self._loss_rank, self._group, self._device = loss_rank, group, device
        self._loss_meta = loss_meta
        # pp_group: the ranks at the same place of every stage (all of ``group`` with one device
        # per stage); the loss is broadcast over all of ``group``
        # a sharded stage's program reads its parameters' local tensors: zero bubble's split
        # backward must reach those (``split_backward.py``)
        from .module import CompiledModule
        from .split_backward import LeafStage

        stage = LeafStage if isinstance(stage_module, CompiledModule) else PipelineStage
        self._stage = stage(stage_module, stage_index, num_stages, device,
                            group=pp_group if pp_group is not None else group)
        if getattr(getattr(stage_module, "training", None), "zero", 0) == 3:  # state dicts read whole parameters
            self.register_state_dict_pre_hook(lambda module, prefix, keep_vars: stage_module.unshard())
            self.register_load_state_dict_pre_hook(lambda module, *args: stage_module.unshard())
            self.register_load_state_dict_post_hook(lambda module, incompatible: stage_module._loaded())
        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "zero-bubble": ScheduleInterleavedZeroBubble}[schedule]
        self._schedule = kind([self._stage] if schedule in _MULTI else self._stage, microbatches,
                              loss_fn=_output_is_loss, scale_grads=loss_reduction == "mean")

    @property
    def stage_module(self) -> nn.Module:
        """The stage module this rank runs: an fx GraphModule, or with several devices per stage
        the DTensor ``ShardedModule`` of it (shares its parameters with this module)."""
        return self._stage.submod

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def optimizer(self, cls=torch.optim.AdamW, **kwargs):
        """``cls`` over this stage's parameters; under ZeRO the stage's sharded optimizer
        (``zero.ShardedOptimizer``: this rank's slices only, the parameters gathered after a step)."""
        if hasattr(self.stage_module, "optimizer"):
            return self.stage_module.optimizer(cls, **kwargs)
        return cls(self.parameters(), **kwargs)

    def train_step(self, *inputs) -> torch.Tensor:
        """One full-batch forward and backward through the schedule; the loss, on every rank.

        Every rank passes the same full batch (the model's inputs, in order). Gradients are
        accumulated into this stage's ``p.grad`` (zero them before, as usual); then step.
        """
        return self._run(self._schedule.step, inputs)

    def forward(self, *inputs) -> torch.Tensor:
        """The full-batch loss, forward only (no gradients), on every rank."""
        with torch.no_grad():
            return self._run(self._schedule.eval, inputs)

    def _run(self, run, inputs: tuple) -> torch.Tensor:
        return run_step(self, run, inputs, positional=self.is_first)


def pipeline_module(model: nn.Module, plan, example_inputs: Sequence[Any], *,
                    group: dist.ProcessGroup | None = None, schedule: str | None = None,
                    device: torch.device | str | None = None, loss_reduction: str = "mean",
                    graph=None, training=None) -> PipelinedModule:
    """This rank's stage of a pipelined plan, ready to ``train_step``.

    ``plan``: an ``autopar.Plan`` with ``stages`` (d devices each), ``microbatches`` and
    ``schedule`` ("gpipe" or "1f1b"; ``schedule=`` overrides it, "" means "gpipe").
    ``graph`` (the model's traced graph, with its ``fx_graph``; default ``plan.graph``) must be
    given for a plan loaded from JSON, which carries no graph. Needs an initialized process group (``group``: default the world)
    whose size is the plan's total device count; rank r runs stage r // d (several devices per
    stage need the default group and shard with ``plan.assignment``). ``model`` is not modified:
    the stage runs on a copy. ``training``: the ``ProgramTraining`` each stage runs (mixed
    precision, recomputation; default the plan's strategy's, ``codegen/training.py``), its
    accumulation 1: the schedule's microbatches are the accumulation. Raises a one-line
    ``ValueError`` when the plan does not fit.
    """
    from torch.distributed.distributed_c10d import get_global_rank

    example_inputs = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) \
        else (example_inputs,)
    schedule = (schedule if schedule is not None else plan.schedule) or "gpipe"
    if schedule == "interleaved-1f1b":  # several stages per rank: interleaved.py
        return _interleaved(model, plan, example_inputs, group, device, loss_reduction, graph, training)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, not {schedule!r}")
    microbatches = int(plan.microbatches)
    if microbatches < 1:
        raise ValueError(f"the plan has {microbatches} microbatches")
    schedule = schedule_run(schedule, microbatches, len(plan.stages))
    graph = fx_form(_checked(plan, graph, loss_reduction), model)  # an exported graph's state read by name
    training = stage_training(graph, plan, training)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not in the process group the pipeline is to run on")
    stages = check_stages(plan.stages, [n.name for n in graph.nodes], world)
    gm = graph.fx_graph
    if any(n.op == "placeholder" and n.target.startswith("*") for n in gm.graph.nodes):
        raise ValueError("pipelining needs a model with named inputs (no *args)")
    parts = split_stages(gm, stages, example_inputs)
    modules = build_stage_modules(model, parts)
    if device is None:
        device = _default_device(group)
    device = torch.device(device)
    per_stage, count = int(plan.stages[0].devices), len(stages)
    k = rank // per_stage
    loss = _loss_meta(gm, example_inputs)
    input_names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    if per_stage == 1 and not (training.dtype or training.recompute or training.cores):
        mine, pp_group = modules[k].to(device), group
        loss_rank = get_global_rank(group or dist.group.WORLD, count - 1)
    else:  # one device a stage under mixed precision or recomputation: a program on a 1-device mesh
        if group is not None:
            raise ValueError("stages of several devices, or trained with mixed precision or recomputation, "
                             "need the default (world) process group")
        mine, pp_group = _sharded_stage(modules[k].to(device), graph, plan, parts[k], stages[k],
                                        count, per_stage, device, training)
        loss_rank = (count - 1) * per_stage
    out = PipelinedModule(mine, k, count, input_names, microbatches, schedule, loss_rank, loss,
                          group, device, loss_reduction, pp_group)
    del modules, parts
    # the copy of the whole model the stages were cut from (every stage's unsharded weights) is
    # held by reference cycles of fx's modules; freed now, not at the garbage collector's next pass
    # (gpt 3.7 M parameters, 512 devices: 14 MiB held on each rank into training otherwise)
    gc.collect()
    return out


# -- several devices per stage: each stage sharded on its own sub-mesh ---------------------------


def stage_mesh_shape(mesh_shape: Sequence[int], devices: int) -> tuple[int, ...]:
    """The inner axes of the plan's mesh that make one stage's sub-mesh (stages take the outer)."""
    shape = tuple(mesh_shape)
    if devices == 1:
        return (1,)
    for j in range(len(shape) + 1):
        if math.prod(shape[j:]) == devices:
            return shape[j:]
    raise ValueError(f"a stage of {devices} devices is no set of inner axes of the plan's mesh {shape}")


def stage_device_mesh(plan, count: int, per_stage: int, device: torch.device):
    """The ``(pp, *sub-mesh)`` DeviceMesh of ``count`` pipeline ranks of ``per_stage`` devices."""
    from torch.distributed.device_mesh import init_device_mesh

    shape = stage_mesh_shape(plan.mesh.shape, per_stage)
    names = ("pp", *(f"mesh{a}" for a in range(len(shape))))
    return init_device_mesh(device.type, (count, *shape), mesh_dim_names=names)


def _sharded_stage(module: fx.GraphModule, graph, plan, part: StageGraph, names: list[str],
                   count: int, per_stage: int, device: torch.device, training, mesh=None):
    """This rank's stage as a DTensor ``ShardedModule`` on the stage's sub-mesh, and the pipeline
    group (the ranks at the same place of every stage's sub-mesh). A one-device stage comes here
    under mixed precision or recomputation: its program (on a mesh of one device, nothing split)
    casts and checkpoints as a single-stage plan's does. ``mesh``: the ``stage_device_mesh`` of
    ``count`` pipeline ranks (made here when None; interleaved 1F1B's stages of a rank share one)."""
    from autopar.core.batch import scale_batch
    from autopar.core.tables import Config

    from .module import shard_module

    shape = stage_mesh_shape(plan.mesh.shape, per_stage)
    inner = tuple(f"mesh{a}" for a in range(len(shape)))
    mesh = mesh if mesh is not None else stage_device_mesh(plan, count, per_stage, device)
    # the planner priced and solved each stage at microbatch size, on the stage's sub-mesh, and
    # wrote the configs on the full mesh (stage axes first): shift them back onto the sub-mesh
    outer = len(plan.mesh.shape) - len(shape)
    assignment = {name: Config(c.splits, tuple(tuple(a - outer for a in axes) for axes in c.mesh_axes))
                  if per_stage > 1 else Config(tuple(1 for _ in c.splits), tuple(() for _ in c.splits))
                  for name, c in plan.assignment.items()}
    if training.zero_axes is not None:  # ZeRO's axes too, from the full mesh onto the sub-mesh
        training = dataclasses.replace(training, zero_axes=tuple(a - outer for a in training.zero_axes if a >= outer))
    micro = scale_batch(graph, plan.microbatches)
    # what crosses a cut is this rank's shard in the plan's layout (``stage_boundary``)
    boundary = stage_boundary(micro, assignment, shape, part, graph.fx_graph, last=not part.carried_out)
    ir = stage_ir(micro, names, part, graph.fx_graph, module)
    if training.dtype is not None:  # mixed precision: what earlier stages send is in the compute dtype
        ir.inputs.update({v: dataclasses.replace(s, dtype=str(training.dtype).removeprefix("torch."))
                          for v, s in ir.inputs.items() if v in part.carried_in and s.dtype.startswith("float")})
    sharded = shard_module(module, ir, {n: assignment[n] for n in names if n in assignment}, shape,
                           device_mesh=mesh[inner], boundary=boundary,
                           training=own_training(training, graph, names))  # context attention as priced
    if sharded._units is not None:  # ZeRO-3: the root whole over the step's microbatches
        sharded._units.step_whole = True
    # the program's calls keep the traced fx nodes, and through them ``module``: its unsharded
    # weights (built from a copy of the whole model) go, the sharded module has its own
    module.to("meta")
    return sharded, mesh.get_group("pp")


def stage_training(graph, plan, training=None):
    """What every stage runs beyond its splits: ``training`` (default the plan's strategy's),
    with one microbatch a step (the schedule's microbatches accumulate the gradients)."""
    from .training import program_training

    training = program_training(graph, plan.strategy) if training is None else training
    if training.zero and min(int(s.devices) for s in plan.stages) < 2:
        raise ValueError(f"ZeRO-{training.zero} is generated in pipelines for stages of several devices only "
                         "(a stage's data-parallel ranks slice it): plan with zero=0, or pipeline=False")
    return dataclasses.replace(training, accumulate=1)


def own_training(training, graph, names: list[str]):
    """``training`` for the stage of IR nodes ``names``: only its own recomputed blocks and
    attention cores (the others run on other stages)."""
    from autopar.core.blocks import block_path

    mine = set(names)
    blocks = {block_path(graph.node(n).module) for n in names}
    return dataclasses.replace(training, recompute=tuple(b for b in training.recompute if b in blocks),
                               cores=tuple(c for c in training.cores if c[0] in mine))


def _checked(plan, graph, loss_reduction: str):
    """The traced graph the stages are cut from (``graph``, else the plan's), after what every
    schedule needs: a loss reduction it knows, a process group, and a traced graph."""
    if loss_reduction not in ("mean", "sum"):
        raise ValueError(f"loss_reduction must be 'mean' or 'sum', not {loss_reduction!r}")
    if not dist.is_initialized():
        raise RuntimeError("pipeline_module needs an initialized process group (torchrun, or "
                           "autopar.runtime.launch.launch)")
    graph = graph if graph is not None else plan.graph
    if graph is None or getattr(graph, "fx_graph", None) is None:
        raise ValueError("pipeline_module needs the model's traced graph: pass "
                         "graph=autopar.trace(model, inputs) (a plan read from a file has none)")
    return graph


def _interleaved(model, plan, example_inputs: tuple, group, device, loss_reduction: str, graph, training):
    """Interleaved 1F1B's module for this rank (``interleaved.py``), after the common checks. Stages
    of several devices, or trained with mixed precision, recomputation or ZeRO, each run as a
    program on its sub-mesh, as one stage per rank does (``_sharded_stage``), the ``v`` stages of a
    rank on one ``(pp, *sub-mesh)`` mesh (torch sends along its "pp" groups)."""
    from .interleaved import interleaved_module, pipeline_ranks

    graph = fx_form(_checked(plan, graph, loss_reduction), model)
    training = stage_training(graph, plan, training)
    if training.zero >= 3:  # the planner does not weigh it (core.schedules.runs_as_priced)
        raise ValueError("ZeRO-3 is generated in 1F1B and zero-bubble pipelines, not interleaved 1F1B: "
                         "plan with zero=2 or schedule=1f1b")
    if any(n.op == "placeholder" and n.target.startswith("*") for n in graph.fx_graph.graph.nodes):
        raise ValueError("pipelining needs a model with named inputs (no *args)")
    device = torch.device(device if device is not None else _default_device(group))
    per_stage = int(plan.stages[0].devices)
    count = pipeline_ranks(plan, dist.get_world_size(group))
    if per_stage == 1 and training.plain:
        return interleaved_module(model, plan, example_inputs, graph, group, device, loss_reduction,
                                  _loss_meta(graph.fx_graph, example_inputs))
    if group is not None:
        raise ValueError("stages of several devices, or trained with mixed precision, recomputation or ZeRO, "
                         "need the default (world) process group")
    mesh = stage_device_mesh(plan, count, per_stage, device)

    def shard(module: fx.GraphModule, part: StageGraph, names: list[str]) -> nn.Module:
        return _sharded_stage(module.to(device), graph, plan, part, names, count, per_stage, device, training,
                              mesh=mesh)[0]

    return interleaved_module(model, plan, example_inputs, graph, mesh.get_group("pp"), device,
                              loss_reduction, _loss_meta(graph.fx_graph, example_inputs), shard=shard)


def _loss_meta(gm: fx.GraphModule, example_inputs: tuple) -> torch.Tensor:
    """The model's output on meta tensors: the shape and dtype of the loss to broadcast."""
    out = HoldsTensor(gm).run(*example_inputs)
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"a pipelined model must return its loss as one tensor, not {type(out).__name__}")
    return out


def _default_device(group) -> torch.device:
    if dist.get_backend(group) == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
