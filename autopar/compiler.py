"""``autopar.compile``: plan once, share the plan, and hand every rank its sharded module.

Under torchrun every rank calls ``compile`` with the same model and inputs. Only rank 0 searches
(the search is deterministic but not free, and two ranks that disagreed on a tie would build
modules that deadlock); the plan travels to the other ranks as its JSON document, the same text
``plan.save`` writes, so what runs is exactly what a saved plan would describe. Every rank traces
the model itself (codegen needs the fx graph, and tracing is cheap) and checks that its graph has
the plan's fingerprint, so a rank that was handed a different model fails instead of hanging.

With one device there is nothing to split: the module runs a copy of the model, so the same script
runs with and without torchrun. Without example inputs all of this happens at the module's first
call, with that call's batch (``parallel_module.py``).
"""

from __future__ import annotations

import os
import shlex
import sys
import threading
from dataclasses import dataclass

import torch.distributed as dist
from torch import nn

from autopar.core.cluster import Cluster
from autopar.core.resolve import resolve_cluster
from autopar.core.errors import AutoparError, LaunchRequiredError, PlanMismatchError
from autopar.core.ir import Graph
from autopar.planning import plan_file
from autopar.parallel_module import ParallelModule
from autopar.planning.plan import Plan

# torch.fx patches module-level functions while it traces, so two traces at once in one process
# (ranks as threads of a threaded process group) see each other's tracer; ranks trace in turn.
_TRACE_LOCK = threading.Lock()


# The planning options ``compile`` forwards to ``autopar.plan`` (their defaults are plan's own).
PLAN_DEFAULTS = dict(cost_model="analytic", search="auto", optimizer="adam", memory_capacity=None, time_limit=60.0,
                     baselines=True, pipeline="auto", hierarchical="auto", follow="auto", pin=None, model_name="",
                     explain=False)
# The training options: planning options, or, with a given plan, what codegen runs in place of its strategy.
TRAINING_DEFAULTS = dict(zero="auto", precision=None, recompute="auto")


def compile(model: nn.Module, devices: int | Cluster | str | None = None, example_inputs=None, *,
            example_kwargs: dict | None = None, cluster: Cluster | str | None = None, plan=None,
            outputs: str = "replicate", inputs: str = "global",
            cost_model="analytic", search: str = "auto", optimizer: str | None = "adam",
            memory_capacity: float | None = None, time_limit: float = 60.0, baselines: bool = True,
            pipeline: bool | str = "auto", hierarchical: bool | str = "auto", follow: bool | str = "auto",
            pin: str | None = None, model_name: str = "", explain: bool = False,
            zero: int | str = "auto", precision: str | None = None, recompute: bool | str = "auto",
            ) -> ParallelModule:
    """This rank's module for training ``model`` on ``devices`` devices: an ``autopar.ParallelModule``.

    ``devices``: a device count, an ``autopar.Cluster`` (what the search prices, and its count)
    or a preset name; default the process group's size (1 without one). More than one device runs
    one process per device (torchrun); the count must be the process group's. ``cluster``: what
    the search prices when ``devices`` is a count (``autopar.core.resolve``; default the local machine,
    the ``cpu`` preset).

    ``example_inputs``: None (plan at the first call, with its batch, as ``torch.compile`` does),
    or a tuple of the forward's positional arguments (``example_kwargs`` a dict of its keyword
    ones, or pass one dict as ``example_inputs``) to plan now. They are the global batch, the
    same on every rank. The older form ``compile(model, example_inputs, ...)`` (a tuple, dict or
    tensor in the second place) still means example inputs. Under a process group, rank 0 plans
    and every rank runs its plan (``_shared_plan``), at the first call too.

    ``plan``: None (search, on rank 0), an ``autopar.Plan``, or the path of a saved plan, used as it
    is. ``outputs``: "replicate" (whole tensors, the same on every rank), "local" (this rank's
    shards, as the plan leaves them) or "dtensor" (those shards as DTensors). ``inputs``: "global"
    (every rank passes the whole batch; the module keeps its slice) or "local" (each rank passes
    only its slice over the data-parallel mesh axes, as with DDP: ``module.data_parallel`` is the
    (replicas, rank) for a ``DistributedSampler``, ``module.local_batch(*whole)`` cuts it from a
    whole batch); "local" plans on the global batch, so it needs ``example_inputs`` (the whole batch).

    ``cost_model`` ... ``explain``: ``autopar.plan``'s options (same names, same defaults).
    ``zero`` (0-3), ``precision`` ("fp32", "bf16") and ``recompute`` (bool, k: every k-th
    repeated block, "attention" or "pointwise"): training options the
    search decides ("auto"/None) or is told; with a given plan, what codegen runs in place of
    the plan's ``strategy`` (``codegen/training.py``).

    The module keeps the model's parameter names (with several devices each parameter a
    DTensor: ``p.full_tensor()`` is its whole value); ``module.plan`` is its plan (after the first
    call when planned then) and ``module.code`` the program this rank runs. Every module trains the
    same way: ``loss = module.train_step(*inputs)`` (forward and backward), then
    ``optimizer.step()``; a single-stage plan also trains with an ordinary ``loss =
    module(*inputs); loss.backward()``. An optimizer may be built on ``module.parameters()`` before
    the first call (``autopar/parallel_module.py``).
    """
    if not (devices is None or isinstance(devices, (int, Cluster, str))) and example_inputs is None:
        devices, example_inputs = None, devices  # compile(model, example_inputs, ...)
    if isinstance(devices, (Cluster, str)):
        if cluster is not None:
            raise ValueError("autopar.compile(model, devices, ...): devices is already a cluster; drop cluster=")
        devices, cluster = (devices.devices if isinstance(devices, Cluster) else None), devices
    if isinstance(example_inputs, (int, str, Cluster)) and not isinstance(example_inputs, bool):
        raise ValueError("autopar.compile(model, devices, example_inputs): the example inputs go third, as a tuple "
                         f"of the forward's arguments (got {example_inputs!r})")
    _require_weights(model)
    if outputs not in ("replicate", "local", "dtensor"):  # checked on one device too, so a script fails early
        raise ValueError(f"outputs must be 'replicate', 'local' or 'dtensor', not {outputs!r}")
    if inputs not in ("global", "local"):
        raise ValueError(f"inputs must be 'global' (every rank the whole batch) or 'local' (its slice), not {inputs!r}")
    if isinstance(example_inputs, dict) and example_kwargs is None:
        example_inputs, example_kwargs = (), example_inputs
    if example_inputs is not None and not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    ahead = bool(example_inputs) or bool(example_kwargs)
    devices = _device_count(devices)
    cluster = resolve_cluster(cluster, devices)
    given = dict(cost_model=cost_model, search=search, optimizer=optimizer, memory_capacity=memory_capacity,
                 time_limit=time_limit, baselines=baselines, pipeline=pipeline, hierarchical=hierarchical,
                 follow=follow, pin=pin, model_name=model_name, explain=explain)
    training = dict(zero=zero, precision=precision, recompute=recompute)
    changed = sorted(k for k, v in given.items() if v != PLAN_DEFAULTS[k])
    if plan is not None and changed:
        raise ValueError(f"a given plan is used as it is: drop the planning options {changed}")
    overrides = {k: v for k, v in training.items() if v != TRAINING_DEFAULTS[k]}
    if plan is not None:  # a given plan: codegen's training options, over its strategy
        builder = _Builder(devices, cluster, plan, {}, overrides, outputs, inputs)
    else:
        builder = _Builder(devices, cluster, None, {**given, **training}, {}, outputs, inputs)
    if not ahead and inputs == "local" and devices > 1:
        raise ValueError('inputs="local" plans on the global batch, which no rank\'s slice shows: pass the whole '
                         'batch as example_inputs to autopar.compile (or use inputs="global")')
    what = type(model).__name__
    if ahead:
        return ParallelModule(model, builder, devices, what, (tuple(example_inputs or ()), example_kwargs))
    return ParallelModule(model, builder, devices, what)


@dataclass
class _Builder:
    """What ``compile`` was told, to plan and build once the call is known (now, or at the first call)."""

    devices: int
    cluster: Cluster
    plan: object  # None, an autopar.Plan or a plan file's path
    plan_kwargs: dict
    overrides: dict
    outputs: str
    inputs: str

    def __call__(self, model: nn.Module, args: tuple, kwargs: dict | None, keep=None, early_optimizer=False):
        """(the module that runs, or None for the model itself on one device; the plan).

        ``early_optimizer``: an optimizer was built on the parameters before this first call; it
        holds every parameter and its state whole, so the plan left to choose ("auto") keeps them
        whole too: no ZeRO, no pipeline stages (a plan that needs them is still what the user gets
        by naming them, or by building the optimizer after the first call)."""
        from autopar.frontend.trace import trace

        plan_kwargs = self.plan_kwargs
        if early_optimizer and self.plan is None:
            plan_kwargs = {**plan_kwargs, **{k: v for k, v in (("zero", 0), ("pipeline", False))
                                             if plan_kwargs.get(k) == "auto"}}

        graph = _graph_of_plan(self.plan, model, args, kwargs)
        if graph is None:
            with _TRACE_LOCK:
                rank0 = not dist.is_initialized() or dist.get_rank() == 0
                graph = trace(model, args, kwargs, progress=None if rank0 else False)
        if self.devices == 1:  # nothing to split (and no mesh to build), process group or not
            return None, _local_plan(model, args, graph, self.cluster, self.plan, plan_kwargs)
        chosen = _shared_plan(model, args, graph, self.cluster, self.plan, plan_kwargs)
        _refuse_over_margin(model, chosen)
        return _build(model, graph, chosen, args, self.outputs, self.inputs, self.overrides, keep), chosen


def _require_weights(model) -> None:
    """A model built on the meta device (shapes, no values) plans, but cannot train: say so at
    compile, in one line, rather than at the first call from inside torch."""
    if not isinstance(model, nn.Module):
        return
    from autopar.core.meta import exclusive

    with exclusive():  # a propagation in another thread (a threaded rank) swaps in meta copies
        meta = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if meta:
        raise ValueError(f"{type(model).__name__}.{meta[0]} is on the meta device (a shape, no values): "
                         f"autopar.plan takes such a model, compile needs its weights; materialize it "
                         f"first (model.to_empty(device='cpu') and initialize, or load a checkpoint)")


def _graph_of_plan(plan, model: nn.Module, args: tuple, kwargs) -> Graph | None:
    """The graph a plan made in this process was searched on, when it is this model's and this
    call's (``frontend/reuse.py``): tracing again would give the same graph, seconds later."""
    from autopar.frontend.inputs import example_call
    from autopar.frontend.reuse import is_trace_of

    graph = getattr(plan, "graph", None) if isinstance(plan, Plan) else None
    if graph is None:
        return None
    call = example_call(model, args, kwargs)
    return graph if is_trace_of(graph, model, call.args, call.kwargs) else None


# -- devices and the process group ------------------------------------------------------------

def _device_count(devices) -> int:
    if devices is None:
        return dist.get_world_size() if dist.is_initialized() else 1
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices must be a positive device count, not {devices!r}")
    if not dist.is_initialized():
        if devices > 1:
            raise LaunchRequiredError(
                f"autopar.compile(..., devices={devices}) runs one process per device; start it with: "
                f"{torchrun_command(devices)}  (or call autopar.runtime.launch.launch(fn, {devices}) from Python)")
        return devices
    world = dist.get_world_size()
    if world != devices:
        raise ValueError(f"autopar.compile(..., devices={devices}) runs under a process group of {world} processes: "
                         f"pass devices={world} or start {devices} processes")
    return devices


def torchrun_command(devices: int, argv: list[str] | None = None) -> str:
    """The command line that runs this very script on ``devices`` local processes."""
    argv = list(sys.argv if argv is None else argv)
    script = argv[0] if argv and argv[0] not in ("", "-c", "-m") else "your_script.py"
    return shlex.join(["torchrun", "--nproc-per-node", str(devices), script, *argv[1:]])


# -- the plan: searched on rank 0, or read, then checked against this rank's graph -------------

def _profiled_on_group(cluster, plan_kwargs):
    """A profiled cost model whose links every rank has fitted together.

    The fit times collectives on the process group, so every rank must run it; the compute is
    then profiled on rank 0 alone, which plans. Before, rank 0 started the fit alone while the
    others waited for its plan, and the run hung."""
    from autopar.codegen.runtime import reshard_probe
    from autopar.cost_models.profiled import ProfiledModel

    # as the registry's entry makes it
    model = ProfiledModel(optimizer=plan_kwargs.get("optimizer", "adam"), probe=reshard_probe)
    model.comm_cluster(cluster)
    return model


def _local_plan(model, inputs, graph, cluster, plan, plan_kwargs) -> Plan:
    if plan is None:
        from autopar.planning.planner import plan as search

        return search(model, tuple(inputs), cluster, graph=graph, **plan_kwargs)
    if isinstance(plan, (str, os.PathLike)):
        what, plan = str(plan), Plan.load(plan)
    elif isinstance(plan, Plan):
        what = "the given plan"
    else:
        raise ValueError(f"plan must be None, an autopar.Plan or a plan file's path, not {type(plan).__name__}")
    _check_fingerprint(plan, graph, what)
    plan_file.check(plan, what, graph)  # every node present, every split one its mesh can make
    return plan


def _shared_plan(model, inputs, graph, cluster, plan, plan_kwargs) -> Plan:
    """Rank 0's plan on every rank (an error on rank 0 is raised on every rank, not a hang)."""
    box: list = [None]
    mine = None
    if plan is None and plan_kwargs.get("cost_model") == "profiled":
        plan_kwargs = {**plan_kwargs, "cost_model": _profiled_on_group(cluster, plan_kwargs)}
    if dist.get_rank() == 0:
        try:
            mine = _local_plan(model, inputs, graph, cluster, plan, plan_kwargs)
            box[0] = ("plan", mine.to_json())
        except (AutoparError, ValueError) as e:
            box[0] = ("error", type(e).__name__, str(e))
    dist.broadcast_object_list(box, src=0)
    if box[0][0] == "error":
        _, kind, message = box[0]
        raise _rebuild(kind, message)
    # rank 0 keeps its own object: it carries the cost tables its report reads
    chosen = mine if mine is not None else Plan.from_json(box[0][1])
    _check_fingerprint(chosen, graph, f"rank 0's plan (on rank {dist.get_rank()})")
    if chosen.devices != dist.get_world_size():
        raise PlanMismatchError(f"the plan is for {chosen.devices} devices; this run has {dist.get_world_size()} "
                                "processes: re-plan or start as many processes as the plan has devices")
    chosen.graph = graph
    return chosen


def _check_fingerprint(plan: Plan, graph, what: str) -> None:
    from autopar.core.fingerprint import fingerprint

    if plan.cost_model == "pase":
        raise ValueError("a plan made with cost_model='pase' is about PaSE's view of the graph and cannot be "
                         "compiled: plan with cost_model='analytic' or 'profiled'")
    fp = fingerprint(graph)
    if fp != plan.fingerprint:
        raise PlanMismatchError(f"{what} was made for another model ({plan.model_name or '?'}, graph "
                                f"{plan.fingerprint}); this model's graph is {fp}: re-plan it")


def _rebuild(kind: str, message: str) -> Exception:
    from autopar.core import errors

    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except TypeError:
            pass
    return ValueError(message) if kind == "ValueError" else AutoparError(message)


def _refuse_over_margin(model: nn.Module, plan: Plan) -> None:
    """InfeasibleError on every rank (one line, with the numbers) when any rank's device cannot hold
    the plan's predicted memory less the safety margin (``core/margin.py``); every rank learns every
    rank's verdict, so none goes on to build a module the others refuse (a hang)."""
    from autopar.codegen.mesh import device_type, local_device, model_device_type
    from autopar.core.errors import InfeasibleError
    from autopar.core.margin import over_margin

    free = None
    if device_type() == "cuda" or model_device_type(model) == "cuda":
        import torch

        device = local_device("nccl") if device_type() == "cuda" else torch.device("cuda", torch.cuda.current_device())
        free = float(torch.cuda.mem_get_info(device)[0])
    why = over_margin(plan.memory_per_device, plan.cluster.get("memory_capacity"), free)
    verdicts: list = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, why)
    refused = [(rank, v) for rank, v in enumerate(verdicts) if v]
    if refused:
        rank, message = refused[0]
        raise InfeasibleError(f"rank {rank}: {message}")


# -- codegen -------------------------------------------------------------------------------------

def _build(model: nn.Module, graph, plan: Plan, inputs, outputs: str, local: str = "global",
           overrides: dict | None = None, keep: dict | None = None) -> nn.Module:
    if plan.stages:
        from autopar.codegen import pipeline

        from autopar.codegen.training import program_training

        training = program_training(graph, plan.strategy, **(overrides or {}), accumulate=1)
        module = pipeline.pipeline_module(model, plan, tuple(inputs), graph=graph, training=training)
    else:
        from autopar.codegen.mesh import device_mesh, model_device_type
        from autopar.codegen.module import compile_module
        from autopar.codegen.training import program_training

        mesh = device_mesh(tuple(plan.mesh.shape), model_device_type(model))
        training = program_training(graph, plan.strategy, **(overrides or {}))
        module = compile_module(model, graph, plan.assignment, mesh, outputs=outputs, inputs=local,
                                training=training, keep=keep, check_batch=local == "global")
    module.plan = plan
    return module


def build_rank_module(model: nn.Module, plan: Plan, inputs: tuple) -> nn.Module:
    """This rank's module of a given single-stage ``plan`` under the process group already running
    (``autopar measure`` runs one rank on a fake group); the plan is checked against the model's
    graph as ``compile`` checks a given plan."""
    from autopar.frontend.trace import trace

    graph = _graph_of_plan(plan, model, tuple(inputs), None)
    if graph is None:
        graph = trace(model, tuple(inputs), None, progress=False)
    chosen = _local_plan(model, inputs, graph, None, plan, {})
    chosen.graph = graph
    return _build(model, graph, chosen, inputs, "local")
