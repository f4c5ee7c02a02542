"""Planning many models at once: fuse siblings, plan each job's parallelism per device count,
cut too-large models into shards, and schedule everything on the devices.

The steps, each from pieces autopar already has:
1. models of one architecture that read the same data are a family; the cost model prices the
   family one by one, fused, and fused in groups (``fusion_choice``), and its groups become jobs;
2. every job is planned by ``autopar.plan`` on 1, 2, 4, ... devices (the options Saturn chooses
   among); where no plan fits one device, the memory model cuts it into shards (``shards``);
3. the jobs are scheduled by Sharded-LRTF (Hydra, the baseline) and by the joint CP-SAT model
   (Saturn-style, autopar's choice), against the lower bound and one-model-at-a-time practice.

``parallel="ddp"`` prices a multi-device option as data parallelism (what runs on a process
subgroup today, ``torch.nn.parallel.DistributedDataParallel``); ``"autopar"`` as autopar's
best plan (data, tensor, pipeline), for planning clusters the local machine cannot run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.nn as nn

from autopar.core.cluster import Cluster
from autopar.core.errors import InfeasibleError
from autopar.core.margin import usable_memory
from autopar.planning.fusion_choice import FusionChoice, choose_fusion, make_cost_model
from autopar.planning.shards import PCIE4_X16, ShardPlan, cut_shards, model_parallel_step, node_profiles
from autopar.search.schedule import Job, Option, Schedule, lower_bound, lrtf, one_at_a_time


@dataclass
class OptionPlan:
    devices: int
    step_seconds: float
    memory: float  # bytes per device
    kind: str  # "one device", "data parallel", "autopar plan", "pipeline", "shards"
    detail: str = ""


@dataclass
class JobPlan:
    name: str
    models: list[int]  # indices into the models given
    fused: bool
    inputs: str  # how a fused job takes its data: "shared" or "stacked"
    options: list[OptionPlan] = field(default_factory=list)
    shards: ShardPlan | None = None


@dataclass
class ManyPlan:
    names: list[str]
    devices: int
    cluster: str
    steps: int
    units: int
    cost_model: str
    parallel: str
    jobs: list[JobPlan]
    fusion: list[tuple[list[int], FusionChoice]]
    bound: tuple[float, float]  # (work, chain) lower bounds
    lrtf: Schedule
    joint: Schedule
    baselines: dict[str, float]
    model_parallel: list[float] = field(default_factory=list)  # per model, one step on all devices

    @property
    def schedule(self) -> Schedule:
        """autopar's schedule: the joint one."""
        return self.joint

    @property
    def lower_bound(self) -> float:
        return max(self.bound)

    def scheduling_jobs(self) -> list[Job]:
        return to_jobs(self.jobs, self.steps, self.units)

    def option(self, job: int) -> OptionPlan:
        return self.jobs[job].options[self.joint.options()[job]]

    def report(self) -> str:
        from autopar.planning.many_report import report

        return report(self)

    def draw(self, path: str) -> None:
        from autopar.planning.many_report import draw

        draw(self, path)


def to_jobs(jobs: list[JobPlan], steps: int, units: int) -> list[Job]:
    per_unit = steps // units
    return [Job(j.name, tuple(Option(o.devices, o.step_seconds * per_unit, o.kind) for o in j.options), units)
            for j in jobs]


def _units(steps: int, units: int) -> int:
    """The largest divisor of ``steps`` not above ``units``: every unit runs the same steps."""
    return max(d for d in range(1, min(units, steps) + 1) if steps % d == 0)


def _same_data(a, b) -> bool:
    import torch

    if len(a) != len(b):
        return False
    return all((x is y) or (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape
                            and x.dtype == y.dtype and torch.equal(x, y)) or (x == y if not isinstance(x, torch.Tensor) else False)
               for x, y in zip(a, b))


def _family_key(model, inputs) -> tuple:
    import torch

    state = tuple((n, tuple(t.shape), t.dtype) for n, t in model.state_dict().items())
    shapes = tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else repr(x) for x in inputs)
    return type(model), state, str(model), shapes


def families(models, inputs: list[tuple]) -> list[list[int]]:
    """Indices of models that could be fused: one architecture and inputs of one shape."""
    out: dict[tuple, list[int]] = {}
    for i, (m, x) in enumerate(zip(models, inputs)):
        out.setdefault(_family_key(m, x), []).append(i)
    return list(out.values())


def _fused_inputs(inputs: list[tuple], members: list[int]) -> tuple[str, tuple]:
    import torch

    first = inputs[members[0]]
    if all(_same_data(inputs[i], first) for i in members[1:]):
        return "shared", first
    stacked = tuple(torch.stack([inputs[i][a] for i in members]) if isinstance(first[a], torch.Tensor) else first[a]
                    for a in range(len(first)))
    return "stacked", stacked


def job_module(models, inputs: list[tuple], job: JobPlan) -> tuple[Any, tuple]:
    """The module a job trains (a model, or its models fused) and the inputs it takes."""
    if not job.fused:
        return models[job.models[0]], inputs[job.models[0]]
    from autopar.fusion import fuse

    mode, data = _fused_inputs(inputs, job.models)
    return fuse([models[i] for i in job.models], inputs[job.models[0]], inputs=mode), data


def device_counts(devices: int) -> list[int]:
    out, g = [], 1
    while g < devices:
        out.append(g)
        g *= 2
    return out + [devices]


def plan_options(module, inputs, cluster: Cluster, *, cost_model: str, optimizer: str | None, parallel: str,
                 host_bandwidth: float, batch: int | None) -> tuple[list[OptionPlan], ShardPlan | None]:
    """The job's options: one per device count where a plan fits, and shards where none fits one.

    With the analytic model and ``parallel="autopar"``, each device count gets ``autopar.plan``'s
    best plan (pipelines included). Otherwise the tables are priced here by the cost model
    object itself, measuring nothing on a live process group (this runs on one rank only)."""
    from autopar.frontend.trace import trace

    graph = trace(module, inputs, progress=False)
    options, shards = [], None
    batch_norm = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())
    model = None if (parallel == "autopar" and cost_model == "analytic") else make_cost_model(cost_model, optimizer)
    for g in device_counts(cluster.devices):
        if parallel == "ddp" and g > 1 and (batch_norm or (batch is not None and batch % g)):
            continue  # data parallelism splits the batch evenly, and would change batch-norm statistics
        sub = cluster.with_devices(g)
        priced = (_plan_option(module, inputs, graph, sub, optimizer) if model is None
                  else _table_option(graph, sub, model, optimizer, parallel))
        if priced is not None:
            options.append(priced)
    if not any(o.devices == 1 for o in options):
        profiles = node_profiles(graph, cluster, model or make_cost_model(cost_model, optimizer), optimizer)
        try:
            shards = cut_shards(profiles, usable_memory(cluster.memory_capacity), host_bandwidth)
            options.insert(0, OptionPlan(1, shards.step_seconds, max(s.memory for s in shards.shards) * 2,
                                         f"{shards.count} shards", shards.describe()))
        except InfeasibleError:
            pass
    return options, shards


def _plan_option(module, inputs, graph, sub: Cluster, optimizer) -> OptionPlan | None:
    from autopar.planning.planner import plan

    try:
        p = plan(module, inputs, sub, cost_model="analytic", graph=graph, optimizer=optimizer, baselines=False)
    except InfeasibleError:
        return None
    if sub.devices == 1:
        return OptionPlan(1, p.cost, p.memory_per_device, "one device")
    kind = f"pipeline, {len(p.stages)} stages" if p.stages else "autopar plan"
    return OptionPlan(sub.devices, p.cost, p.memory_per_device, kind)


def _table_option(graph, sub: Cluster, model, optimizer, parallel: str) -> OptionPlan | None:
    from autopar.cost_models.tables import build_tables
    from autopar.planning.baselines import data_parallel_choice
    from autopar.planning.planner import run_search

    tables = build_tables(graph, sub, model, space="mesh", mode="train", optimizer=optimizer)
    tables.memory_capacity = usable_memory(sub.memory_capacity)  # what a plan may use (core/margin.py)
    if sub.devices == 1:
        choice, kind = [0] * len(tables.nodes), "one device"
    elif parallel == "ddp":
        choice, kind = data_parallel_choice(graph, tables), "data parallel"
    else:
        try:
            choice, kind = run_search(tables, "auto", 60.0).choice, "autopar plan"
        except InfeasibleError:
            return None
    memory = float(tables.total_memory(choice))
    if memory > tables.memory_capacity:
        return None
    return OptionPlan(sub.devices, float(tables.total(choice)), memory, kind)


def plan_many(models, example_inputs, cluster: Cluster, *, steps: int = 100, units: int = 4,
              cost_model: str = "analytic", fusion_cost_model: str | None = None, optimizer: str | None = "adamw",
              fuse: bool | int | str = "auto", parallel: str = "autopar", names: list[str] | None = None,
              host_bandwidth: float = PCIE4_X16, time_limit: float = 10.0) -> ManyPlan:
    """Plan and schedule ``models`` on ``cluster`` (see the module docstring).

    ``example_inputs``: one tuple all models take, or a list with one tuple per model.
    ``steps``: training steps per model; ``units``: chunks each model's steps are scheduled in.
    ``fuse``: "auto" (the cost model decides), False, or a group size to impose.
    ``optimizer``: the optimizer's name, for memory and for fused training (adamw, adam, sgd);
    None when the models train with an optimizer that cannot be fused.
    """
    models = list(models)
    if not models:
        raise ValueError("plan_many: no models given")
    if parallel not in ("autopar", "ddp"):
        raise ValueError(f"parallel must be 'autopar' or 'ddp', not {parallel!r}")
    if steps < 1 or units < 1:
        raise ValueError(f"steps and units must be >= 1, not {steps} and {units}")
    inputs = per_model_inputs(models, example_inputs)
    names = names or [f"model{i}" for i in range(len(models))]
    units = _units(steps, units)
    fusion_cost_model = fusion_cost_model or cost_model
    jobs, fusion = _group(models, inputs, names, cluster, fuse, fusion_cost_model, optimizer)
    planned: dict[tuple, tuple] = {}  # jobs of one architecture and width share their options
    for job in jobs:
        key = (_family_key(models[job.models[0]], inputs[job.models[0]]), len(job.models), job.inputs)
        if key not in planned:
            module, data = job_module(models, inputs, job)
            planned[key] = plan_options(module, data, cluster, cost_model=cost_model, optimizer=optimizer,
                                        parallel=parallel, host_bandwidth=host_bandwidth, batch=_batch(data, job))
        options, job.shards = planned[key]
        job.options = list(options)
        if not job.options:
            raise InfeasibleError(f"{job.name} fits no device count up to {cluster.devices}, even cut into shards: "
                                  "add devices or memory")
    sched = to_jobs(jobs, steps, units)
    bound = lower_bound(sched, cluster.devices)
    base = lrtf(sched, cluster.devices)
    from autopar.search.joint import joint

    best = joint(sched, cluster.devices, time_limit=time_limit, hint=base)
    mp = _model_parallel(models, inputs, cluster, optimizer)
    baselines = {
        "one model at a time, model parallel on all devices (Hydra's baseline)": steps * sum(mp),
    }
    alone = [j for j in jobs if not j.fused]
    if len(alone) == len(jobs):
        widest = [max(j.options, key=lambda o: (o.devices, -o.step_seconds)) for j in jobs]
        if all(o.devices == cluster.devices for o in widest):
            baselines["one model at a time, autopar's plan on all devices"] = one_at_a_time(
                sched, cluster.devices, lambda job: max(range(len(job.options)),
                                                        key=lambda i: (job.options[i].devices, -job.options[i].seconds))).makespan
    return ManyPlan(names, cluster.devices, cluster.name, steps, units, cost_model, parallel, jobs, fusion, bound,
                    base, best, baselines, mp)


def per_model_inputs(models, example_inputs) -> list[tuple]:
    if isinstance(example_inputs, list) and len(example_inputs) == len(models) and \
            all(isinstance(x, (tuple, list)) for x in example_inputs):
        return [tuple(x) for x in example_inputs]
    one = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    return [one] * len(models)


def _batch(data: tuple, job: JobPlan) -> int | None:
    import torch

    x = next((t for t in data if isinstance(t, torch.Tensor) and t.dim() > 0), None)
    if x is None:
        return None
    return x.shape[1] if job.fused and job.inputs == "stacked" else x.shape[0]


def _group(models, inputs, names, cluster, fuse, cost_model, optimizer) -> tuple[list[JobPlan], list]:
    jobs, fusion = [], []
    fusable = optimizer in ("adamw", "adam", "sgd")
    for fam in families(models, inputs):
        k = 1
        mode = "shared"
        if len(fam) > 1 and fusable and fuse is not False:
            mode, data = _fused_inputs(inputs, fam)
            if fuse == "auto":
                choice = choose_fusion([models[i] for i in fam], inputs[fam[0]], cluster, cost_model=cost_model,
                                       optimizer=optimizer, inputs=mode, fused_inputs=data)
                fusion.append((fam, choice))
                k = choice.k
            elif isinstance(fuse, int) and not isinstance(fuse, bool) and fuse >= 1:
                k = min(fuse, len(fam))
            elif fuse is not True:
                raise ValueError(f"fuse must be 'auto', True, False or a group size, not {fuse!r}")
            else:
                k = len(fam)
        for a in range(0, len(fam), k):
            group = fam[a:a + k]
            name = names[group[0]] if len(group) == 1 else "+".join(names[i] for i in group)
            jobs.append(JobPlan(name, group, len(group) > 1, mode if len(group) > 1 else "shared"))
    return jobs, fusion


def _model_parallel(models, inputs, cluster: Cluster, optimizer) -> list[float]:
    from autopar.frontend.trace import trace

    out, seen = [], {}
    for m, x in zip(models, inputs):
        key = _family_key(m, x)
        if key not in seen:
            graph = trace(m, x, progress=False)
            seen[key] = model_parallel_step(graph, node_profiles(graph, cluster, None, optimizer), cluster,
                                            cluster.devices)
        out.append(seen[key])
    return out

