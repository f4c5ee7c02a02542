"""``autopar sweep``: a hyper-parameter sweep trained as one schedule, beside each model alone.

    autopar sweep zoo:gpt:layers=2,seq=32,vocab=128 --lr 1e-3,2e-3,4e-3,8e-3 --vary width=32,64 --nproc 2

builds one model per (learning rate, size) of the grid, plans them together
(``autopar.compile_many``: fusion where the cost model predicts it faster, a device count per
job, the joint schedule), trains them on ``--nproc`` local CPU processes, then trains every
model alone on one process and prints the two final losses side by side. Exit code 0 when every
model's losses match its solo run, 1 when one differs, 2 on bad input.
"""

from __future__ import annotations

RTOL = 1e-5  # float32 rounding over a few steps: fused kernels and split batches sum in other orders


def comparison(names: list[str], sweep: list[list[float]], alone: list[list[float]], rtol: float = RTOL) -> tuple[str, bool]:
    """A table of every model's final loss in the sweep and alone, and whether all steps agree."""
    rows = [f"{'model':<24} {'final loss, sweep':>18} {'final loss, alone':>18} {'largest rel. diff':>18}"]
    ok = True
    for name, a, b in zip(names, sweep, alone):
        diff = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)) if len(a) == len(b) else float("inf")
        ok &= diff <= rtol
        rows.append(f"{name[:24]:<24} {a[-1]:>18.6f} {b[-1]:>18.6f} {diff:>18.1e}")
    rows.append(f"equal: every step of every model within rtol {rtol:g}" if ok
                else f"DIFFERENT: some model's losses differ by more than rtol {rtol:g}")
    return "\n".join(rows), ok


def _floats(text: str, what: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{what} takes comma-separated numbers, not {text!r}") from None
    if not values:
        raise ValueError(f"{what} needs at least one value")
    return values


def build_grid(spec: str, lrs: list[float], vary: str | None):
    """(models, per-model inputs, names, hparams): one model per (size, learning rate), each size's
    models built alike (the MODEL's seed), so that only the learning rate differs between them."""
    from autopar.cli.model_spec import load

    sizes: list[str] = [""]
    key = None
    if vary:
        key, eq, values = vary.partition("=")
        if not eq or not values or not spec.startswith("zoo:"):
            raise ValueError("--vary takes key=v1,v2,... and works with zoo:NAME models")
        sizes = [v.strip() for v in values.split(",") if v.strip()]
    models, inputs, names, hparams = [], [], [], []
    for size in sizes:
        one = spec
        if key:
            sep = "," if spec.count(":") >= 2 else ":"
            one = f"{spec}{sep}{key.strip()}={size}"
        for lr in lrs:  # every learning rate from the same initial weights, as a sweep compares them
            model, x, _ = load(one)
            models.append(model)
            inputs.append(x)
            names.append((f"{key}={size} " if key else "") + f"lr={lr:g}")
            hparams.append({"lr": lr})
    return models, inputs, names, hparams


def run(args) -> int:
    import autopar
    from autopar.cli.training import ADAM_EPS

    if args.nproc < 1 or args.steps < 1:
        raise ValueError("--nproc and --steps must be at least 1")
    lrs = _floats(args.lr, "--lr")
    models, inputs, names, hparams = build_grid(args.model, lrs, args.vary)
    for h in hparams:
        h["eps"] = ADAM_EPS
    fuse = {"auto": "auto", "no": False}.get(args.fuse)
    if fuse is None:
        if not args.fuse.isdigit() or int(args.fuse) < 1:
            raise ValueError(f"--fuse takes auto, no or a group size, not {args.fuse!r}")
        fuse = int(args.fuse)
    many = autopar.compile_many(models, args.nproc, inputs, steps=args.steps, hparams=hparams, names=names,
                                fuse=fuse, cost_model=args.cost_model)
    print(many.report())
    if args.svg:
        many.plan.draw(args.svg)
        print(f"timeline written to {args.svg}")
    print()
    text, ok = comparison(names, many.train(timeout=args.timeout), many.solo())
    print(text)
    return 0 if ok else 1


def add_parser(sub) -> None:
    """The ``sweep`` subcommand (called by ``autopar.cli.build_parser``)."""
    s = sub.add_parser("sweep", help="train a grid of learning rates (x sizes) as one schedule, beside each alone",
                       description="Build one model per learning rate (and per value of --vary), plan them "
                       "together (fusion where the cost model predicts it faster, a device count per job, the joint "
                       "schedule), train them on --nproc local CPU processes, then train each model alone and print "
                       "the final losses side by side.")
    s.add_argument("model", metavar="MODEL", help="zoo:NAME[:key=value,...] or file.py:factory")
    s.add_argument("--lr", default="1e-3,2e-3,4e-3,8e-3",
                   help="AdamW learning rates, comma-separated (default 1e-3,2e-3,4e-3,8e-3)")
    s.add_argument("--vary", metavar="KEY=V1,V2", help="a zoo size to vary too, e.g. width=32,64")
    s.add_argument("--nproc", type=int, default=2, help="local CPU processes, the devices (default 2)")
    s.add_argument("--steps", type=int, default=20, help="training steps per model (default 20)")
    s.add_argument("--fuse", default="auto", help="auto (the cost model decides, the default), no, or a group size")
    s.add_argument("--cost-model", default=None, choices=["profiled", "analytic"],
                   help="what prices fusion and device counts (default: profiled on this CPU)")
    s.add_argument("--svg", metavar="OUT", help="draw the per-device timeline to this file")
    s.add_argument("--timeout", type=float, default=600.0, help="stop the processes after this many seconds (600)")
    s.set_defaults(func=run)
