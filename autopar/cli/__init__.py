"""The ``autopar`` command line (also ``python -m autopar``).

Every failure the user can fix ends in one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from autopar.core.errors import AutoparError


def _cmd_trace(args) -> int:
    import autopar
    from autopar.cli import model_spec

    model, inputs, kwargs, name = model_spec.load_call(args.model)
    graph = autopar.trace(model, inputs, kwargs)
    graph.model_name = graph.model_name or name
    print(graph)
    return 0


def _cluster(args):
    """The cluster ``--cluster``/``--devices`` name, by the resolver ``autopar.plan`` and
    ``autopar.compile`` use (``autopar.core.resolve``): the same default everywhere."""
    from autopar.core.resolve import resolve_cluster

    if args.devices is not None and args.devices < 1:
        raise ValueError(f"--devices must be at least 1, got {args.devices}")
    return resolve_cluster(args.cluster, args.devices)


def _plan(args, model_arg=None, **overrides):
    import autopar
    from autopar.cli import model_spec

    model, inputs, example_kwargs, name = model_spec.load_call(model_arg or args.model)
    kwargs = dict(cost_model=args.cost_model, space=args.space, search=args.search, mode=args.mode,
                  model_name=name, example_kwargs=example_kwargs,
                  pipeline={"auto": "auto", "on": True, "off": False}[args.pipeline],
                  explain=getattr(args, "explain", False))
    if getattr(args, "memory", None) is not None:
        if not args.memory > 0:
            raise ValueError(f"--memory is GiB per device and must be > 0, not {args.memory:g}")
        kwargs["memory_capacity"] = args.memory * 2**30
    kwargs.update(_training_args(args))
    kwargs.update(overrides)
    record = _published(args, name)
    if record is not None:  # the paper's cluster, precision and plan (pinned, priced as a baseline)
        args.cluster = args.cluster or record.cluster
        kwargs.setdefault("precision", kwargs.get("precision") or record.precision)
        kwargs["pin"] = kwargs.get("pin") or (
            f"tensor={record.tensor},pipeline={record.pipeline},data={record.data},zero={record.zero},"
            f"microbatch={record.microbatch_size}"
            + (f",recompute={int(record.recompute)}" if record.recompute is not None else "")
            + (",zero_inner=1" if record.zero_inner else "")
            + (f",context={record.context},ring=0" if record.context > 1 else "")  # Llama 3 gathers K/V
            + (f",schedule={record.schedule}" if record.schedule else ""))
    cluster = _cluster(args)
    from autopar.frontend.depth import trace_for_planning

    # a status line on a terminal, silent elsewhere; a deep model's repeated layers traced once
    kwargs["graph"] = trace_for_planning(model, inputs, example_kwargs)
    from autopar.core.progress import phase

    with phase(f"planning {name} on {cluster.devices} devices ({kwargs['cost_model']} model)"):
        plan = autopar.plan(model, inputs, cluster, **kwargs)
    if record is not None and "published" in plan.baselines and plan.baselines["published"].strategy:
        plan.baselines["published"].strategy.reference = {
            "utilisation": record.utilisation, "measure": record.measure, "figure": record.figure,
            "source": record.source}
    return plan


def _training_args(args) -> dict:
    from autopar.cli import run_setup

    out = {}
    if getattr(args, "precision", None):
        out["precision"] = args.precision
    if getattr(args, "zero", "auto") != "auto":
        out["zero"] = int(args.zero)
    out.update(run_setup.training_flags(args))
    if getattr(args, "pin", None):
        out["pin"] = args.pin
    if getattr(args, "hierarchical", "auto") != "auto":
        out["hierarchical"] = args.hierarchical == "on"
    if getattr(args, "follow", "auto") != "auto":
        out["follow"] = args.follow == "on"
    return out


def _published(args, name: str):
    """The published run of a zoo model when ``--published`` is given (ValueError if it has none)."""
    if not getattr(args, "published", False):
        return None
    from autopar import zoo

    record = zoo.published_run(name) if args.model.startswith("zoo:") else None
    if record is None:
        raise ValueError(f"--published needs one of the zoo's published trainings "
                         f"({', '.join('zoo:' + n for n in zoo.PUBLISHED_MODELS)}), not {args.model!r}")
    return record


def _output_paths(args) -> None:
    """Every file ``plan`` will write can be written: checked before planning, not after it.
    A missing folder is an error (as with a shell redirection), not created: a typo should not
    leave new folders behind."""
    for flag in ("json", "svg", "png"):
        path = getattr(args, flag, None)
        if not path:
            continue
        where, parent = Path(path), Path(path).parent
        if where.is_dir():
            raise ValueError(f"--{flag} {path} is a folder: give a file name, e.g. {where / ('plan.' + flag)}")
        if not parent.is_dir():
            raise ValueError(f"--{flag} {path}: there is no folder {str(parent)!r}: create it first "
                             f"(mkdir -p {parent})")
        if not os.access(parent, os.W_OK):
            raise ValueError(f"--{flag} {path}: the folder {str(parent)!r} is not writable")


def _cmd_plan(args) -> int:
    _output_paths(args)
    plan = _plan(args)
    # the files first: a reader that closes the pipe early (``| head``) must not cost them
    written = []
    if args.json:
        plan.save(args.json)
        written.append(f"plan written to {args.json}")
    for path in filter(None, (args.svg, args.png)):
        from autopar.report.picture import draw

        draw(plan, path)
        written.append(f"picture written to {path}")
    print(plan.report(explain=args.explain))
    for line in written:
        print(line)
    return 0


def _cmd_compare(args) -> int:
    from autopar.report.compare import compare_lines

    print("\n".join(compare_lines(_plan(args))))
    return 0


def _cmd_show(args) -> int:
    from autopar.planning.plan import Plan

    if Path(args.plan).is_dir():
        raise ValueError(f"{args.plan} is a folder: give the plan's file (autopar plan ... --json PLAN.json)")
    print(Plan.load(args.plan).report(explain=args.explain))
    return 0


def _cmd_run(args) -> int:
    """Train a few steps of the sharded module on local CPU processes, beside one process."""
    from autopar.cli import run_setup
    from autopar.cli.model_spec import load_call
    from autopar.cli.training import LossComparison, run_worker
    from autopar.runtime.launch import launch

    if args.nproc < 1:
        raise ValueError(f"--nproc must be at least 1, got {args.nproc}")
    if args.steps < 1:
        raise ValueError(f"--steps must be at least 1, got {args.steps}")
    saving = run_setup.checkpointing(args)
    model, inputs, kwargs, _ = load_call(args.model)  # a bad MODEL fails here, in one line, before any process starts
    if args.plan:  # a plan that cannot train, before any process starts
        from autopar.planning.plan import Plan

        Plan.load(args.plan, mode="train")
    # the same steps on one process first: a model that cannot train fails here, in one line
    single = run_setup.reference_losses(model, inputs, kwargs, saving.start + args.steps, args.lr, args.model)
    plan = run_setup.search(args, model, inputs, kwargs)
    run_setup.check_memory(plan, args.nproc, args.ignore_memory)
    results = launch(run_worker, args.nproc, args.model, args.steps, args.lr, plan.to_json(), saving,
                     timeout=args.timeout)
    errors = [r[1] for r in results if r[0] == "error"]
    if errors:
        raise AutoparError(errors[0])
    print(plan.report())
    print()
    if saving.folder:
        from autopar.runtime.checkpoint import describe

        print(f"checkpoints: {describe(saving.folder)}" + (f" (resumed from step {saving.start})"
                                                           if saving.resume else ""))
        print()
    comparison = LossComparison(results[0][1], single[saving.start:], args.nproc, first=saving.start)
    print(comparison.table())
    if comparison.diverged:  # nan/inf: not "equal", and not a difference autopar made
        raise AutoparError(comparison.diverged)
    return 0 if comparison.equal else 1


def _cmd_demo(args) -> int:
    """The main job on an embedded default; grows as planning and codegen land."""
    import autopar

    model, inputs = autopar.zoo.get("gpt", layers=2)
    graph = autopar.trace(model, inputs)
    graph.model_name = "gpt (2 layers)"
    print(graph)
    print()
    big, big_inputs = autopar.zoo.get("gpt", layers=12, width=768, heads=12, seq=1024, batch=16,
                                      vocab=32768, device="meta")
    plan = autopar.plan(big, big_inputs, "8xA100", model_name="gpt (12 layers, width 768, seq 1024)")
    print(plan.report())
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse's parser, its errors one line (no usage block above them), as every other error here."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def _positive(text: str) -> float:
    """A finite number > 0 (for --lr): nan, inf and 0 are refused by argparse, before anything runs."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, not {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from autopar.cli import run_setup
    from autopar.core.cluster import known_presets
    from autopar.planning import registry

    p = _Parser(
        prog="autopar",
        description="Automatic parallelization-strategy search for PyTorch models.",
        epilog="MODEL is zoo:NAME[:key=value,...] (e.g. zoo:gpt:layers=4) or path/to/file.py:factory, "
        "where factory() returns (model, example_inputs), (model, {keyword inputs}) or (model, args, kwargs).",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    t = sub.add_parser("trace", help="trace MODEL and print its operator graph")
    t.add_argument("model", metavar="MODEL", help="zoo:NAME[:key=value,...] or file.py:factory")
    t.set_defaults(func=_cmd_trace)
    for cmd, func, text in (("plan", _cmd_plan, "find the best strategy for MODEL and print its report"),
                            ("compare", _cmd_compare, "data parallel vs expert vs autopar, side by side")):
        c = sub.add_parser(cmd, help=text, description=text)
        c.add_argument("model", metavar="MODEL", help="zoo:NAME[:key=value,...] or file.py:factory")
        c.add_argument("--devices", type=int, default=None, help="number of devices (default: the cluster's; the default cluster's is the local machine's cores)")
        c.add_argument("--cluster", default=None,
                       help=f"cluster preset: {', '.join(known_presets())} (and NxGxGPU patterns such as "
                       "2x8xH100; default: cpu, the local machine, as autopar.plan and autopar.compile)")
        c.add_argument("--cost-model", default="analytic", choices=list(registry.COST_MODELS),
                       help=registry.choices_help(registry.COST_MODELS))
        c.add_argument("--space", default="mesh", help=registry.choices_help(registry.SPACES))
        c.add_argument("--search", default="auto", choices=list(registry.SEARCHES),
                       help=registry.choices_help(registry.SEARCHES))
        c.add_argument("--pipeline", default="auto", choices=["auto", "on", "off"],
                       help="search pipeline stages too: auto (on clusters of several nodes, or when no "
                       "single-stage plan fits), on, off")
        c.add_argument("--mode", default="train", choices=["train", "inference"],
                       help="price forward+backward+gradient sync (train) or the forward only")
        c.add_argument("--memory", type=float, default=None, metavar="GIB",
                       help="memory per device in GiB (default: the cluster's); plans keep "
                            "the safety margin of autopar/core/margin.py below it")
        c.add_argument("--precision", default=None, choices=["fp32", "bf16", "fp16"],
                       help="fp32, or bf16/fp16 mixed precision (fp32 master weights and optimizer state); "
                       "default fp32, and the devices' fastest mixed precision for the hierarchical search")
        c.add_argument("--zero", default="auto", choices=["auto", "0", "1", "2", "3"],
                       help="ZeRO stage over the data-parallel devices (auto: searched)")
        run_setup.add_training_flags(c)
        c.add_argument("--follow", default="auto", choices=["auto", "on", "off"],
                       help="search a smaller space where ops without FLOPs or parameters follow their "
                       "producer's layout (the plan says so); auto: only when the full space is too big")
        c.add_argument("--hierarchical", default="auto", choices=["auto", "on", "off"],
                       help="plan by tensor/pipeline/data degrees per cluster level (auto: above 64 devices, "
                       "several pods, or with --pin, and beside the flat search where memory binds it, the "
                       "faster plan taken; off: the flat search alone)")
        c.add_argument("--pin", default=None, metavar="K=V,...",
                       help="price a plan fixed by its degrees beside autopar's, e.g. tensor=8,pipeline=64,data=6 "
                       "(also zero=, recompute=, microbatch=, and expert= for routed experts split over that "
                       "many of the data devices)")
        c.add_argument("--published", action="store_true",
                       help="for zoo:megatron_8b, megatron_1t, mt_nlg_530b, palm_540b, llama3_405b(_long): plan on the paper's "
                       "cluster and price the paper's plan and its reported utilisation beside autopar's")
        c.set_defaults(func=func)
        if cmd == "plan":
            c.add_argument("--json", metavar="OUT", help="save the plan as JSON")
            c.add_argument("--svg", metavar="OUT", help="draw the plan to an SVG file")
            c.add_argument("--png", metavar="OUT", help="draw the plan to a PNG file")
            c.add_argument("--explain", action="store_true",
                           help="print every term of the predicted step time with its arithmetic")
    r = sub.add_parser("run", help="train a few steps of MODEL's sharded module on local CPU processes",
                       description="Plan MODEL for --nproc local CPU processes (or use --plan), train --steps "
                       "AdamW steps of the sharded module on gloo, and print the report and the loss of every "
                       "step beside the same steps of the unsplit model on one process.")
    r.add_argument("model", metavar="MODEL", help="zoo:NAME[:key=value,...] or file.py:factory")
    r.add_argument("--nproc", type=int, default=2, help="number of local CPU processes (default 2)")
    r.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    r.add_argument("--lr", type=_positive, default=1e-3, help="AdamW learning rate (default 1e-3)")
    r.add_argument("--plan", metavar="PLAN.json", help="run a saved plan (autopar plan ... --json) without searching")
    r.add_argument("--cluster", default="cpu",
                   help="cluster preset the search prices (default cpu: the local machine, --nproc devices)")
    r.add_argument("--cost-model", default="analytic",
                   choices=[k for k, e in registry.COST_MODELS.items() if e.space == "mesh"],
                   help="cost model of the search (default analytic): "
                   + registry.choices_help({k: e for k, e in registry.COST_MODELS.items() if e.space == "mesh"}))
    run_setup.add_training_flags(r)
    r.add_argument("--timeout", type=_positive, default=600.0, help="stop the processes after this many seconds")
    r.add_argument("--ignore-memory", action="store_true",
                   help="start even when the plan's predicted memory x --nproc exceeds the local machine's available memory")
    r.add_argument("--checkpoint", metavar="DIR", default=None,
                   help="save the sharded model and optimizer under DIR (torch.distributed.checkpoint; after the "
                   "last step, and every --checkpoint-every steps)")
    r.add_argument("--checkpoint-every", type=int, default=None, metavar="N", help="also save every N steps")
    r.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint under --checkpoint DIR: --steps more steps")
    r.set_defaults(func=_cmd_run)
    from autopar.cli.sweep import add_parser as add_sweep_parser

    add_sweep_parser(sub)  # `autopar sweep`: autopar/cli/sweep.py
    from autopar.cli.measure import add_parser as add_measure_parser

    add_measure_parser(sub)  # `autopar measure`: autopar/cli/measure.py
    s = sub.add_parser("show", help="print the report of a saved plan (autopar plan ... --json OUT)")
    s.add_argument("plan", metavar="PLAN.json")
    s.add_argument("--explain", action="store_true", help="also print the arithmetic, if the plan kept it")
    s.set_defaults(func=_cmd_show)
    d = sub.add_parser("demo", help="trace and show the default model (what `make demo` runs)")
    d.set_defaults(func=_cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:  # `autopar plan ... | head`: the reader has what it wanted
        _quiet_stdout()
        return 141  # 128 + SIGPIPE, what a shell shows for a tool ended by a closed pipe
    except KeyboardInterrupt:  # Ctrl-C: the ranks were ended on the way out (autopar/runtime/launch.py)
        print(f"\nautopar: interrupted (Ctrl-C) during `autopar {args.command}`; nothing is left running",
              file=sys.stderr)
        return 130  # 128 + SIGINT, what a shell shows for a tool ended by Ctrl-C
    except (AutoparError, ValueError, KeyError) as e:
        print(f"autopar: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except OSError as e:  # a file or folder the user named: one line, what and where
        where = f": {e.filename}" if e.filename else ""
        print(f"autopar: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's own flush at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (captured in a test)
        pass


if __name__ == "__main__":
    sys.exit(main())
