"""What ``autopar run`` settles in its own process before it starts any rank.

Everything that can be found out here fails here, in one line, rather than as N ranks' tracebacks
or an out-of-memory kill minutes later: the model trains on one process (its forward returns a
scalar loss, its inputs suit its layers), the plan is searched (or read) once and its predicted
memory x local processes fits the local machine's available memory, and the checkpoint to resume from
exists. The plan then travels to the ranks, which use it as it is (no search on rank 0 again).
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.report.format import fmt_bytes


@dataclass
class Checkpointing:
    """``--checkpoint DIR`` / ``--checkpoint-every N`` / ``--resume`` as the ranks need them."""

    folder: str | None = None
    every: int = 0  # 0: only after the last step
    resume: bool = False
    start: int = 0  # the step the run resumes from (0: from scratch)

    def due(self, step: int, last: int) -> bool:
        """Whether to save after global step ``step`` (1-based) of a run ending at ``last``."""
        return self.folder is not None and (step == last or (self.every > 0 and step % self.every == 0))


def checkpointing(args) -> Checkpointing:
    """The run's checkpoint options, checked: ValueError (one line) when they do not fit together."""
    from autopar.runtime import checkpoint

    folder, every, resume = args.checkpoint, args.checkpoint_every, args.resume
    if every is not None and every < 1:
        raise ValueError(f"--checkpoint-every must be at least 1 step, got {every}")
    if folder is None:
        if resume or every is not None:
            flag = "--resume" if resume else "--checkpoint-every"
            raise ValueError(f"{flag} needs --checkpoint DIR: the folder the checkpoints are in")
        return Checkpointing()
    start = 0
    if resume:
        done = checkpoint.steps(folder)
        if not done:
            raise ValueError(f"--resume: no checkpoint in {folder!r}: run once with --checkpoint {folder} first")
        start = done[-1]
    return Checkpointing(str(folder), every or 0, resume, start)


def reference_losses(model, inputs, kwargs, steps: int, lr: float, spec: str, progress=None) -> list[float]:
    """The unsplit model's losses on this one process; its own error, in one line, if it does not train.
    On a terminal (``progress``: None, or True/False to force) a bar says what runs: for a big model
    these steps take minutes before any rank starts."""
    from autopar.core.progress import Progress
    from autopar.cli.training import single_process_losses

    label = f"reference: {spec} on one process"
    try:
        with Progress(steps, label, enabled=progress) as bar:
            bar.update(0)  # the line shows at once, not after the first step
            return single_process_losses(model, inputs, steps, lr, kwargs, after_step=lambda k: bar.update())
    except ValueError:
        raise
    except (RuntimeError, TypeError, IndexError) as e:  # torch's own: wrong dtypes, shapes, indices
        message = " ".join(str(e).split())
        raise ValueError(f"{spec} does not train on one process either: {type(e).__name__}: {message} "
                         "(fix the model or its example inputs; autopar runs what the model runs)") from None


def search(args, model, inputs, kwargs):
    """The plan the ranks will use: ``--plan`` read, or searched here for --nproc devices."""
    import autopar
    from autopar.core.resolve import resolve_cluster
    from autopar.planning.plan import Plan

    if args.plan:
        return Plan.load(args.plan)
    cluster = resolve_cluster(args.cluster, args.nproc)
    graph = autopar.trace(model, inputs, kwargs)
    return autopar.plan(model, inputs, cluster, graph=graph, example_kwargs=kwargs, cost_model=args.cost_model,
                        **training_flags(args))


def add_training_flags(parser) -> None:
    """``--recompute`` and ``--accumulate``, as ``autopar plan`` and ``autopar run`` take them."""
    from autopar.planning.degrees import RECOMPUTE_VALUES

    parser.add_argument("--recompute", default="auto", metavar="HOW",
                        help=f"activation recomputation: auto (searched), {RECOMPUTE_VALUES}")
    parser.add_argument("--accumulate", default="auto", metavar="K",
                        help="gradient accumulation: K microbatches a step, one gradient sync (auto: searched "
                        "where memory binds; 1: none)")


def training_flags(args) -> dict:
    """``autopar.plan``'s ``recompute`` and ``accumulate`` from the flags given (ValueError in one
    line for a value neither takes)."""
    from autopar.planning.degrees import recompute_value

    out = {}
    if getattr(args, "recompute", "auto") != "auto":
        try:
            out["recompute"] = recompute_value(args.recompute)
        except ValueError as e:
            raise ValueError(f"--{e}") from None
    accumulate = getattr(args, "accumulate", "auto")
    if accumulate != "auto":
        if not (str(accumulate).isdigit() and int(accumulate) >= 1):
            raise ValueError(f"--accumulate {accumulate}: write a count of microbatches >= 1 (1: none) or auto")
        out["accumulate"] = int(accumulate)
    return out


def available_memory() -> int | None:
    """Bytes the local machine can give new processes now (MemAvailable in /proc/meminfo, else psutil); None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def check_memory(plan, processes: int, ignore: bool = False) -> None:
    """ValueError (one line) when the plan's predicted memory per device exceeds the cluster's
    stated capacity less the safety margin (``core/margin.py``: what ``autopar.compile`` refuses on
    every rank), or its memory per process x ``processes`` what the local machine has available;
    ``ignore`` (--ignore-memory) skips the second check."""
    from autopar.core.margin import over_margin

    per = float(getattr(plan, "memory_per_device", 0.0) or 0.0)
    refused = over_margin(per, plan.cluster.get("memory_capacity"))  # every rank's compile would refuse it
    if refused:
        raise ValueError(refused)
    have = available_memory()
    if ignore or have is None or not per > 0:
        return
    need = per * processes
    if need > have:
        raise ValueError(f"the plan predicts {fmt_bytes(per)} per process x {processes} processes = "
                         f"{fmt_bytes(need)}, but the local machine has {fmt_bytes(have)} available: use a smaller "
                         "model or fewer processes, or pass --ignore-memory to start anyway")
