"""Run one rank of a plan in this process and put its measured memory and compute beside the plan's.

A plan for N devices predicts what each device holds and computes. ``measure`` checks that on the
shards the plan really gives one rank: it starts torch's fake process group (``backend="fake"``:
every collective returns at once without moving data, so shapes and placements are the real
ones and the communication costs nothing), builds rank R's module with the same codegen
``autopar.compile`` uses, and trains a few steps (forward, backward, AdamW step) on this
machine's device (CUDA when present, else the CPU).

What is compared, and why it is fair:

* compute: the median time of a training step less the communication inside it, against the
  sum of the plan's per-node ``compute`` terms (forward, backward, recomputation and the
  optimizer update; the resharding and gradient sync the plan prices are left out on both sides).
  On the fake group a collective moves nothing but still works on this rank (the fake all-gather
  copies its input into every slot) and a reshard does its local slicing and copying around it:
  ``measure_comm.comm_timed`` times all of that on the same clock, and it is subtracted (printed
  beside). The first step is a warm-up (the optimizer allocates its state, kernels are chosen).
  The clock is the profiled cost model's (``cost_models/op_runner.clock``): on a CPU running torch
  on one thread, this thread's CPU time (the step runs on the calling thread, so that is its work
  on the core, memory stalls included, without the time the OS gave the core to other processes);
  CUDA and several threads: wall time, the device synchronised after each step.
* memory: the peak bytes this rank holds during the steps. CUDA: ``torch.cuda.max_memory_allocated``
  less what was allocated before the module was built (the unsplit model, kept by the caller).
  CPU: the batch, plus the peak during two training steps of the running sum of every allocation
  and free the profiler records from the moment the module's build begins (``torch.profiler``
  with ``profile_memory=True``: the allocator's own events), so whatever the build and the first
  step leave alive (shards, gradient buckets, optimizer state) counts without being listed here.
  The profiler is off while the steps are timed (it slows every op).

The module is built as ``autopar.compile`` builds it: from a model whose weights are all present
(the whole model is initialised, then each parameter sharded onto this rank), which is fine for a
model that fits one host's memory; a model that does not cannot be measured this way yet.
Pipelined plans: the rank's stage module runs in the schedule's order on inputs made at the
shapes the plan gives its stage (``measure_stage.py`` says how, and why not under the schedule).
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from autopar.core.errors import AutoparError
from autopar.report.format import fmt_bytes
from autopar.runtime.allocator import keep_freed_memory

_STEPS = "autopar.measure: training steps"  # the profiler's label of the steps whose peak is taken


@dataclass
class Measurement:
    """Predicted beside measured for one rank of a plan (bytes and seconds per step)."""

    rank: int
    devices: int
    device: str  # "cpu" or "cuda"
    memory_method: str  # how the measured peak was taken
    predicted_memory: float
    measured_memory: float
    state_bytes: float  # what this rank keeps between steps: local parameters, buffers, optimizer state
    param_bytes: float  # its parameters' local shards (as it computes with them)
    predicted_compute: float
    measured_compute: float
    step_times: list[float]  # whole steps, communication included
    clock: str = "wall time"  # what the step times read
    comm_times: list[float] = field(default_factory=list)  # of each step, the communication's local work

    def lines(self) -> list[str]:
        """The report: predicted beside measured, the method, and last the two ratios."""
        ms = [f"{t * 1e3:.2f}" for t in self.step_times]
        cs = [f"{t * 1e3:.2f}" for t in self.comm_times] or ["0"]
        return [f"rank {self.rank} of {self.devices} on {self.device} (fake process group: collectives take no time)",
                f"kept between steps (local parameters, buffers, optimizer state): {fmt_bytes(self.state_bytes)}",
                f"peak memory: measured {fmt_bytes(self.measured_memory)}, predicted "
                f"{fmt_bytes(self.predicted_memory)} ({self.memory_method})",
                f"compute per step: measured {self.measured_compute * 1e3:.2f} ms (median of steps after the first, "
                f"less the communication's local work: {', '.join(ms)} ms less {', '.join(cs)} ms; {self.clock}), "
                f"predicted {self.predicted_compute * 1e3:.2f} ms (the plan's compute terms)",
                f"memory measured/predicted: {self.memory_ratio:.2f}; "
                f"compute measured/predicted: {self.compute_ratio:.2f}"]

    @property
    def memory_ratio(self) -> float:
        return self.measured_memory / self.predicted_memory if self.predicted_memory else float("inf")

    @property
    def compute_ratio(self) -> float:
        return self.measured_compute / self.predicted_compute if self.predicted_compute else float("inf")


def stage_of(plan, rank: int) -> int | None:
    """The pipeline stage rank ``rank`` runs (stages take consecutive ranks), None without stages."""
    return rank // int(plan.stages[0].devices) if plan.stages else None


def fullest_rank(plan) -> int:
    """The first rank of the stage with the highest predicted memory per device (0 without stages)."""
    if not plan.stages:
        return 0
    k = max(range(len(plan.stages)), key=lambda i: plan.stages[i].memory or 0.0)
    return k * int(plan.stages[0].devices)


def predicted_memory(plan, rank: int) -> float:
    """Peak bytes the plan predicts for rank ``rank``'s device (its stage's, in a pipeline)."""
    k = stage_of(plan, rank)
    if k is not None and plan.stages[k].memory is not None:
        return float(plan.stages[k].memory)
    return float(plan.memory_per_device)


def predicted_compute(plan, rank: int = 0) -> float:
    """Seconds of compute per step the plan predicts for rank ``rank``'s device (its rows' compute
    terms; in a pipeline its stage's ``compute``; a hierarchical plan of one stage, which has no
    rows, its price's compute and optimizer-step terms, as a stage's ``compute`` adds them; nan
    where the plan records none of these)."""
    k = stage_of(plan, rank)
    if k is not None:
        c = plan.stages[k].compute
        return float("nan") if c is None else float(c)
    if plan.rows:
        return float(sum(r.compute for r in plan.rows))
    terms = plan.strategy.time_terms if plan.strategy is not None else {}
    if "compute" not in terms:
        return float("nan")
    return float(terms["compute"] + terms.get("optimizer step", 0.0))


@contextmanager
def fake_group(rank: int, world_size: int):
    """This process as rank ``rank`` of ``world_size`` on torch's fake process group."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise ValueError("measure runs one rank on a fake process group of its own; this process already "
                         "has a process group: run it in a fresh process")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def measure(model, inputs: tuple, plan, rank: int = 0, steps: int = 3, kwargs: dict | None = None,
            device: str | None = None, lr: float = 1e-3) -> Measurement:
    """Build rank ``rank``'s module of ``plan`` (a single-stage plan made for ``model`` and
    ``inputs``) over a fake group and train ``steps`` (>= 2) AdamW steps; see the module's docstring."""
    if not 0 <= rank < plan.devices:
        raise ValueError(f"--rank {rank} is not a rank of the plan's {plan.devices} devices (0..{plan.devices - 1})")
    if steps < 2:
        raise ValueError(f"measure needs at least 2 steps (the first is a warm-up), got {steps}")
    if kwargs:
        raise ValueError("measure runs models called with positional inputs only for now")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        model = model.to("cuda")
        inputs = tuple(t.to("cuda") if isinstance(t, torch.Tensor) else t for t in inputs)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
    with fake_group(rank, plan.devices):
        if device == "cuda":
            module, optimizer, step = _build(model, plan, inputs, device, lr)
            torch.cuda.reset_peak_memory_stats()
            times, comm = _steps(step, steps, torch.cuda.synchronize, _clock(device),
                                 lambda: as_after_sync(optimizer))
            peak = torch.cuda.max_memory_allocated() - before
            method = "CUDA: torch.cuda.max_memory_allocated, less the unsplit model"
        else:  # the build and two steps profiled for memory, then the steps timed without the profiler
            keep_freed_memory()  # as autopar's CPU ranks run (runtime/allocator.py)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                        profile_memory=True) as prof:
                module, optimizer, step = _build(model, plan, inputs, device, lr)
                with torch.profiler.record_function(_STEPS):
                    _steps(step, 2, None, time.perf_counter)
            peak = _tensor_bytes(inputs) + _peak_during(prof, _STEPS)
            as_after_sync(optimizer)
            times, comm = _steps(step, steps, None, _clock(device))
            method = ("CPU: the batch + the peak, during two steps, of the running sum of torch.profiler's "
                      "allocation events since the module's build began")
        params = sum(_local(p.detach()).nbytes for p in module.parameters())
        state = _state_bytes([*module.parameters(), *module.buffers(), *_optimizer_tensors(optimizer)])
    compute = statistics.median(t - c for t, c in zip(times[1:], comm[1:]))
    return Measurement(rank, plan.devices, device, method, predicted_memory(plan, rank), float(peak),
                       float(state), float(params), predicted_compute(plan, rank), compute, times,
                       "this thread's CPU time" if _clock(device) is time.thread_time else "wall time", comm)


def _build(model, plan, inputs, device: str, lr: float):
    """(module, optimizer, one training step) of this rank."""
    from autopar.cli.measure_checks import checked
    from autopar.compiler import build_rank_module

    try:
        module = build_rank_module(model, plan, inputs)
        if plan.stages:
            from autopar.cli.measure_stage import stage_run

            run = stage_run(model, module, module.plan, module.plan.graph, inputs, device, lr)
            return module, run.optimizer, checked(run.step)
        optimizer = module.optimizer(torch.optim.AdamW, lr=lr)

        def step():
            module.train_step(*inputs)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return module, optimizer, checked(step)
    except (AutoparError, ValueError):
        raise
    except (RuntimeError, TypeError, NotImplementedError) as e:
        raise AutoparError(f"rank's module does not build on the fake process group: {type(e).__name__}: "
                           f"{' '.join(str(e).split())[:300]}") from None


def _clock(device: str):
    from autopar.cost_models.op_runner import clock

    return clock(device)


def _steps(step, steps: int, sync, now, settle=None) -> tuple[list[float], list[float]]:
    """Each step's time and the time of the communication inside it (``measure_comm``);
    ``settle`` runs after the first (warm-up) step, untimed."""
    from autopar.cli.measure_comm import comm_timed

    out, comm = [], []
    for i in range(steps):
        with comm_timed(now, sync) as c:
            t0 = now()
            step()
            if sync is not None:
                sync()
            out.append(now() - t0)
        comm.append(c.seconds)
        if i == 0 and settle is not None:
            settle()
    return out, comm


def as_after_sync(optimizer) -> int:
    """Give the optimizer's second moments the values the data-parallel sum would: on the fake
    group a rank's gradient stays its own, so a parameter read by index (an embedding) has an
    exact zero gradient, hence second moment, in every row this rank's batch did not read, where
    the real sum holds what the other ranks of its group read (64 ranks of one sequence each read
    8,192 tokens of a 4,096-row vocabulary a step); the square root of the update runs about 5x
    slower over exact zeros than over normal numbers on some CPUs (0.5 M elements: 1.2 ms against
    0.22), a cost of the fake group, not of the plan. Each exact zero of a tensor with nonzero
    entries takes the mean of those (as if another rank had read that row); returns how many."""
    filled = 0
    for state in optimizer.state.values():
        v = state.get("exp_avg_sq") if isinstance(state, dict) else None
        if not isinstance(v, torch.Tensor):
            continue
        v = _local(v)
        zero = v == 0
        nonzero = v.numel() - int(zero.sum())
        if 0 < nonzero < v.numel():
            v.masked_fill_(zero, float(v.sum()) / nonzero)
            filled += v.numel() - nonzero
    return filled


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _optimizer_tensors(optimizer) -> list:
    """What the optimizer steps (under ZeRO: this rank's master slices) and its state tensors."""
    stepped = [p for group in optimizer.param_groups for p in group["params"]]
    return stepped + [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def _state_bytes(tensors) -> int:
    """Bytes of the storages under ``tensors`` (local shards), each storage once."""
    seen, total = set(), 0
    for t in tensors:
        storage = _local(t.detach()).untyped_storage()
        if storage.nbytes() == 0 or storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def _tensor_bytes(values) -> int:
    return sum(v.untyped_storage().nbytes() for v in values if isinstance(v, torch.Tensor))


def _peak_during(prof, label: str) -> int:
    """The highest running sum of the CPU allocator's events (bytes, + allocated / - freed) from the
    start of the profile, taken while the ``label`` range runs."""
    events = prof.profiler.kineto_results.events()
    ranges = [(e.start_ns(), e.end_ns()) for e in events if e.name() == label]
    if not ranges:
        raise AutoparError("the profiler recorded no training steps: the memory cannot be measured")
    begin, end = ranges[0]
    memory = sorted((e.start_ns(), e.nbytes()) for e in events
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    running, peak = 0, None
    for at, nbytes in memory:
        running += nbytes
        if begin <= at <= end:
            peak = running if peak is None else max(peak, running)
    return running if peak is None else peak


# -- the command line: ``autopar measure`` -------------------------------------------------------

def one_process_cluster(devices: int):
    """The default cluster a measurement is priced on: ``devices`` devices, each as fast and as big
    as this whole process (the ``cpu`` preset for one device, with the count of the plan): the one
    process runs rank R alone, so dividing the local machine's cores among N processes, as the ``cpu``
    preset does for N local ranks, would price a device slower than the one measured.

    Two figures of the device differ from the preset's defaults, both from how this host runs a
    step: its peak FLOP/s is a matmul's measured rate (``measure_cpu``), which the step's matmuls
    reach (85-100 GFLOP/s on one thread at the plans' shapes), so its compute efficiency is 1, not
    the 0.6 of a datasheet peak; and every op costs host work whatever its size (``op_overhead``,
    ``CPU_OP_OVERHEAD``), which at one sequence per device is a third of a pipeline stage's step.
    And the update is torch's, op by op (``foreach_update``), as the measured steps run it."""
    from dataclasses import replace

    from autopar.core.cluster import Cluster
    from autopar.core.hardware import CPU_OP_OVERHEAD

    return replace(Cluster.preset("cpu", devices=1).with_devices(devices), name="cpu (one process per device)",
                   compute_efficiency=1.0, op_overhead=CPU_OP_OVERHEAD, foreach_update=True)


def add_parser(sub) -> None:
    """The ``measure`` subcommand (called by the CLI's ``build_parser``)."""
    m = sub.add_parser("measure", help="build one rank of a plan on a fake process group and measure its memory "
                       "and compute beside the plan's prediction",
                       description="Build rank --rank's module of a plan for --devices devices in this one process "
                       "over torch's fake process group (collectives do nothing, shapes are real), train --steps "
                       "AdamW steps on the local machine's device (CUDA if present, else CPU), and print the measured "
                       "peak memory and compute time per step beside the plan's.")
    m.add_argument("model", metavar="MODEL", help="zoo:NAME[:key=value,...] or file.py:factory")
    m.add_argument("--plan", metavar="PLAN.json", help="measure a saved plan (autopar plan ... --json) without searching")
    m.add_argument("--rank", default="0", help="the rank whose module is built (default 0), or 'fullest': the "
                   "first rank of the pipeline stage with the highest predicted memory")
    m.add_argument("--devices", type=int, default=8, help="devices the plan is made for (default 8)")
    m.add_argument("--cluster", default=None,
                   help="cluster preset the plan is priced on (default: N devices each as fast as this process)")
    m.add_argument("--cost-model", default="analytic", choices=["analytic", "profiled"],
                   help="cost model of the search (default analytic)")
    m.add_argument("--pipeline", default="off", choices=["auto", "on", "off"],
                   help="search pipeline stages in the flat mesh's search too (default off)")
    m.add_argument("--hierarchical", default="auto", choices=["auto", "on", "off"],
                   help="plan by tensor/pipeline/data degrees (auto: above 64 devices; its plans may be pipelined)")
    m.add_argument("--zero", default="auto", choices=["auto", "0", "1", "2", "3"], help="ZeRO stage (auto: searched)")
    m.add_argument("--memory", type=float, default=None, metavar="GIB", help="memory per device in GiB")
    m.add_argument("--pin", default=None, metavar="K=V,...",
                   help="measure the plan fixed by these degrees instead of autopar's, e.g. tensor=8,pipeline=2 "
                   "(data: the devices left; also zero=, recompute=, microbatch=, schedule=; the hierarchical "
                   "search's plan, priced with the analytic model)")
    from autopar.cli.run_setup import add_training_flags

    add_training_flags(m)
    m.add_argument("--steps", type=int, default=4, help="training steps, the first a warm-up (default 4)")
    m.add_argument("--json", metavar="OUT", help="also write the figures (bytes, seconds) to this JSON file")
    m.set_defaults(func=run)


def run(args) -> int:
    import autopar
    from autopar.core.resolve import resolve_cluster
    from autopar.cli.model_spec import load_call
    from autopar.cli.measure_checks import check_pin
    from autopar.cli.run_setup import training_flags
    from autopar.planning.plan import Plan

    if args.rank != "fullest":
        try:
            args.rank = int(args.rank)
        except ValueError:
            raise ValueError(f"--rank takes a rank (0, 1, ...) or 'fullest', not {args.rank!r}") from None
    if args.rank != "fullest" and (args.rank < 0 or (not args.plan and args.rank >= args.devices)):
        raise ValueError(f"--rank {args.rank} is not a rank of {args.devices} devices (0..{args.devices - 1})")
    if args.steps < 2:
        raise ValueError(f"--steps must be at least 2 (the first is a warm-up), got {args.steps}")
    check_pin(args)
    model, inputs, kwargs, name = load_call(args.model)
    if args.plan:
        plan = Plan.load(args.plan, mode="train")
    else:
        if args.devices < 1:
            raise ValueError(f"--devices must be at least 1, got {args.devices}")
        cluster = resolve_cluster(args.cluster, args.devices) if args.cluster else one_process_cluster(args.devices)
        options = dict(cost_model=args.cost_model, model_name=name, example_kwargs=kwargs,
                       pipeline={"auto": "auto", "on": True, "off": False}[args.pipeline])
        if args.hierarchical != "auto":
            options["hierarchical"] = args.hierarchical == "on"
        if args.zero != "auto":
            options["zero"] = int(args.zero)
        if args.memory is not None:
            if not args.memory > 0:
                raise ValueError(f"--memory is GiB per device and must be > 0, not {args.memory:g}")
            options["memory_capacity"] = args.memory * 2**30
        options.update(training_flags(args))
        if args.pin:
            options["pin"] = args.pin
        plan = autopar.plan(model, inputs, cluster, **options)
        if args.pin:  # the pinned plan is priced beside autopar's as its "published" baseline
            plan = plan.baselines["published"]
    if plan.devices == 1:
        raise ValueError("the plan is for one device: measure a plan for several (--devices N)")
    if not torch.cuda.is_available():
        torch.set_num_threads(1)  # one device is one process of one core, as the cpu preset prices it
    rank = fullest_rank(plan) if args.rank == "fullest" else args.rank
    result = measure(model, tuple(inputs), plan, rank=rank, steps=args.steps, kwargs=kwargs)
    if args.json:
        import json
        from dataclasses import asdict

        with open(args.json, "w") as f:
            json.dump(asdict(result), f, indent=1)
    print("\n".join(result.lines()))
    return 0

