"""Run the strategy-quality suite, compare it with the stored baseline, write results.md and speedup.png.

    python -m benchmarks.run                       # full suite; exit 1 if a case moved from baseline.json
    python -m benchmarks.run --fast                # only the cases the regression test re-plans
    python -m benchmarks.run --update --reason ".."  # rewrite baseline.json (why it may move goes in the file)

A predicted cost may only move (up or down: a plan that looks cheaper is as suspect as one that
looks dearer), or a fitting plan stop fitting, through ``--update`` with a reason: that is how an
intentional cost-model change is told apart from a regression. Each plan's cost is also re-priced
from its chosen configs in the tables it was made from: a search that reports less than its own
assignment costs fails whatever the baseline says.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

from benchmarks.cases import SUITE, Case, build, by_name, capacity, plan_case

HERE = Path(__file__).resolve().parent
BASELINE = HERE / "baseline.json"
RESULTS = HERE / "results.md"
PLOT = HERE / "speedup.png"
TOLERANCE = 1e-3  # a cost may drift by 0.1% (float summation order, solver tolerances) before it is a regression
REPRICE_RTOL = 1e-9  # a plan's cost against its own assignment in its own tables: float summation only


@dataclasses.dataclass
class Outcome:
    """What one case's plan predicts; ``error`` is set (and the numbers are None) when planning failed."""

    name: str
    cost: float | None = None
    dp_cost: float | None = None
    expert_cost: float | None = None
    units: str = ""
    memory_per_device: float | None = None
    dp_memory_per_device: float | None = None
    capacity: float | None = None
    fits: bool | None = None
    dp_fits: bool | None = None
    search_seconds: float | None = None  # median over repeats of plan.search.seconds
    plan_seconds: float | None = None  # median wall time of the whole autopar.plan call (tracing excluded)
    stages: int = 1
    repriced: float | None = None  # the chosen configs summed in the plan's tables (None: no tables kept)
    error: str | None = None

    @property
    def speedup(self) -> float | None:
        if self.cost and self.dp_cost:
            return self.dp_cost / self.cost
        return None


def run_case(case: Case, repeat: int = 3, traced: dict | None = None) -> Outcome:
    """Plan ``case`` ``repeat`` times (the cost must not change between runs; the times are medians).

    ``traced`` caches (model, inputs, graph) per model and size across cases, as tracing is not what is timed.
    """
    traced = {} if traced is None else traced
    key = (case.model, case.batch, case.sizes)
    try:
        if key not in traced:
            import autopar

            model, inputs = build(case)
            traced[key] = (model, inputs, autopar.trace(model, inputs))
        model, inputs, graph = traced[key]
        plans, walls = [], []
        for _ in range(max(1, repeat)):
            start = time.perf_counter()
            plans.append(plan_case(case, (model, inputs), graph=graph))
            walls.append(time.perf_counter() - start)
    except Exception as e:  # a failing case is a result to report, not a crash of the suite
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        return Outcome(case.name, error=last[:300])
    p = plans[0]
    cap = capacity(case)
    dp = p.baselines.get("data_parallel")
    expert = p.baselines.get("expert")
    return Outcome(
        name=case.name, cost=float(p.cost), units=p.units,
        dp_cost=float(dp.cost) if dp else None, expert_cost=float(expert.cost) if expert else None,
        memory_per_device=float(p.memory_per_device),
        dp_memory_per_device=float(dp.memory_per_device) if dp else None, capacity=cap,
        fits=bool(p.memory_per_device <= cap), dp_fits=bool(dp.memory_per_device <= cap) if dp else None,
        search_seconds=statistics.median(q.search.seconds for q in plans), plan_seconds=statistics.median(walls),
        stages=len(getattr(p, "stages", None) or []) or 1, repriced=reprice(p))


def reprice(plan) -> float | None:
    """What ``plan``'s assignment costs in the tables it was made from: node and edge entries of the
    chosen configs summed afresh, not the search's own total (None for plans that keep no tables:
    pipelined and hierarchical ones)."""
    t = getattr(plan, "tables", None)
    if t is None:
        return None
    choice = [t.configs[i].index(plan.assignment[name]) for i, name in enumerate(t.nodes)]
    return float(t.total(choice))


def run_suite(cases: list[Case], repeat: int = 3, log=print) -> dict[str, Outcome]:
    traced: dict = {}
    out = {}
    for case in cases:
        start = time.perf_counter()
        out[case.name] = o = run_case(case, repeat, traced)
        what = f"ERROR {o.error}" if o.error else f"cost {o.cost:.6g} {o.units}, x{o.speedup or 0:.3g} over DP"
        log(f"{case.name:32s} {time.perf_counter() - start:7.1f} s  {what}")
    return out


# -- the baseline ------------------------------------------------------------------------------------

def baseline_entry(o: Outcome) -> dict:
    if o.error:
        return {"error": o.error}
    return {"cost": o.cost, "memory_per_device": o.memory_per_device, "fits": o.fits}


def load_baseline(path: Path = BASELINE) -> dict:
    return json.loads(Path(path).read_text())


def compare(baseline: dict, outcomes: dict[str, Outcome], suite: list[Case] = SUITE) -> list[str]:
    """Regressions of ``outcomes`` against ``baseline`` (the JSON document), one line per problem naming the case.

    A problem: a baseline case gone from the suite; a cost worse or better by more than ``TOLERANCE``; a
    cost that is not what the plan's configs price at; a plan that fitted and no longer does; a case that
    planned and now fails. Cases not in ``outcomes`` are not judged.
    """
    problems = []
    names = {c.name for c in suite}
    for name, old in sorted(baseline["cases"].items()):
        if name not in names:
            problems.append(f"{name}: in the baseline but no longer in the suite (benchmarks/cases.py)")
            continue
        new = outcomes.get(name)
        if new is None or "error" in old:
            continue
        if new.error:
            problems.append(f"{name}: planned before (cost {old['cost']:.6g}), now fails: {new.error}")
            continue
        if new.cost > old["cost"] * (1 + TOLERANCE):
            problems.append(f"{name}: predicted cost worse than baseline: {old['cost']:.6g} -> {new.cost:.6g} "
                            f"({_rel(old['cost'], new.cost)}; tolerance {TOLERANCE:.1%})")
        elif new.cost < old["cost"] * (1 - TOLERANCE):
            problems.append(f"{name}: predicted cost better than baseline: {old['cost']:.6g} -> {new.cost:.6g} "
                            f"({_rel(old['cost'], new.cost)}; tolerance {TOLERANCE:.1%}); if the plan really "
                            f"is cheaper, move the baseline with --update --reason")
        if new.repriced is not None and abs(new.cost - new.repriced) > REPRICE_RTOL * abs(new.repriced):
            problems.append(f"{name}: the plan reports cost {new.cost:.9g} but its chosen configs price at "
                            f"{new.repriced:.9g} in its own tables")
        if old.get("fits") and not new.fits:
            problems.append(f"{name}: plan no longer fits: it needed {old['memory_per_device'] / 2**30:.3g} "
                            f"GiB/device, now {new.memory_per_device / 2**30:.3g} GiB of {new.capacity / 2**30:.3g}")
    return problems


def check(baseline_path: Path = BASELINE, cases: list[Case] | None = None,
          outcomes: dict[str, Outcome] | None = None) -> list[str]:
    """Re-plan ``cases`` (default: the fast ones) unless ``outcomes`` are given, and compare with the baseline file."""
    if outcomes is None:
        cases = [c for c in SUITE if c.fast] if cases is None else cases
        outcomes = {c.name: run_case(c, repeat=1) for c in cases}
    return compare(load_baseline(baseline_path), outcomes)


def _rel(old: float, new: float) -> str:
    return f"{(new - old) / old:+.3%}" if old else "n/a"


def moved(old_doc: dict | None, outcomes: dict[str, Outcome]) -> list[str]:
    """What an update changes, case by case (old -> new, relative change)."""
    old_cases = (old_doc or {}).get("cases", {})
    lines = []
    for name, o in outcomes.items():
        new, old = baseline_entry(o), old_cases.get(name)
        if old is None:
            lines.append(f"  {name}: new case: {new}")
        elif old != new:
            parts = []
            for k in ("cost", "memory_per_device"):
                if k in old and k in new and old[k] != new[k]:
                    parts.append(f"{k} {old[k]:.6g} -> {new[k]:.6g} ({_rel(old[k], new[k])})")
            if old.get("fits") != new.get("fits"):
                parts.append(f"fits {old.get('fits')} -> {new.get('fits')}")
            if ("error" in old) != ("error" in new) or old.get("error") != new.get("error"):
                parts.append(f"error {old.get('error')!r} -> {new.get('error')!r}")
            lines.append(f"  {name}: " + "; ".join(parts))
    for name in old_cases:
        if name not in outcomes and name not in by_name():
            lines.append(f"  {name}: removed from the suite")
    return lines


def update(outcomes: dict[str, Outcome], reason: str, path: Path = BASELINE) -> list[str]:
    old = load_baseline(path) if Path(path).exists() else None
    lines = moved(old, outcomes)
    kept = {k: v for k, v in (old or {}).get("cases", {}).items() if k in by_name() and k not in outcomes}
    cases = dict(sorted({**kept, **{n: baseline_entry(o) for n, o in outcomes.items()}}.items()))
    doc = {"reason": reason, "updated": time.strftime("%Y-%m-%d %H:%M:%S"), "tolerance": TOLERANCE, "cases": cases}
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")
    return lines


# -- results.md and speedup.png ---------------------------------------------------------------------

def _num(x, fmt=".4g") -> str:
    return "-" if x is None else format(x, fmt)


def _secs(x) -> str:
    return "-" if x is None else (f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s")


def results_table(outcomes: dict[str, Outcome], cases: list[Case]) -> str:
    head = ("| case | devices | cost model | autopar cost | data-parallel cost | expert cost | speedup over DP "
            "| PaSE DP/opt (pase.md §8) | memory/device | fits (DP fits) | search (median) | plan call (median) "
            "| PaSE search (Table I) |")
    rows = [head, "|" + "---|" * head.count("|")[:-1] if False else "|" + "---|" * (head.count("|") - 1)]
    for c in cases:
        o = outcomes.get(c.name)
        if o is None:
            continue
        if o.error:
            rows.append(f"| {c.name} | {c.devices} | {c.cost_model} | **error**: `{o.error}` | | | | "
                        f"{_num(c.pase_ratio, '.3f')} | | | | | {_secs(c.pase_search_s)} |")
            continue
        mem = "-" if not o.memory_per_device else f"{o.memory_per_device / 2**30:.3g} GiB"
        cap = "" if c.memory_capacity is None else f" (limit {c.memory_capacity / 2**30:.3g} GiB)"
        stages = f", {o.stages} stages" if o.stages > 1 else ""
        rows.append(f"| {c.name} | {c.devices} | {c.cost_model} ({c.space}) | {_num(o.cost)} {o.units}{stages} "
                    f"| {_num(o.dp_cost)} | {_num(o.expert_cost)} | {_num(o.speedup, '.3f')} "
                    f"| {_num(c.pase_ratio, '.3f')} | {mem}{cap} | {o.fits} ({o.dp_fits}) "
                    f"| {_secs(o.search_seconds)} | {_secs(o.plan_seconds)} | {_secs(c.pase_search_s)} |")
    return "\n".join(rows)


def write_results(outcomes: dict[str, Outcome], cases: list[Case], path: Path = RESULTS, wall: float = 0.0,
                  repeat: int = 3) -> None:
    text = f"""# Strategy-quality suite (generated by `python -m benchmarks.run`)

Predicted costs are in each cost model's units: PaSE's model (`pase-flop`, r = 5000: 10 TFLOP/s,
16 GB/s; docs/pase.md §1) for PaSE's four models, seconds per training step under the analytic
model for GPT and the MLP. "speedup over DP" = data-parallel cost / autopar cost under the same model;
PaSE's published DP/optimum ratios (pase.md §8) are predicted ratios too, directly comparable.
Search times are medians of {repeat} plans (tracing excluded) on the machine benchmarks/README.md describes;
PaSE's are from its paper's Table I (Xeon E5 host). PaSE's model has no memory model ("-").
Whole suite: {len(outcomes)} cases in {wall:.0f} s wall.

{results_table(outcomes, cases)}

![speedup over data parallelism](speedup.png)
"""
    Path(path).write_text(text)


def write_plot(outcomes: dict[str, Outcome], cases: list[Case], path: Path = PLOT) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    pase = [c for c in cases if c.cost_model == "pase"]
    for i, model in enumerate(dict.fromkeys(c.model for c in pase)):
        color = f"C{i}"
        mine = [(c.devices, outcomes[c.name].speedup) for c in pase
                if c.model == model and c.name in outcomes and outcomes[c.name].speedup]
        if mine:
            left.plot(*zip(*mine), "o-", color=color, label=f"{model} (autopar)")
        pub = [(c.devices, c.pase_ratio) for c in pase if c.model == model and c.pase_ratio]
        if pub:
            left.plot(*zip(*pub), "x--", color=color, markersize=9, label=f"{model} (PaSE published)")
        failed = [c.devices for c in pase if c.model == model and outcomes.get(c.name) and outcomes[c.name].error]
        if failed:
            left.plot(failed, [1.0] * len(failed), "v", color=color, label=f"{model}: planning failed")
    left.set(xscale="log", yscale="log", xlabel="devices p", ylabel="predicted DP cost / plan cost",
             title="PaSE's models under PaSE's cost model")
    left.set_xticks([4, 8, 16, 32, 64], ["4", "8", "16", "32", "64"])
    left.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=7)
    other = [c for c in cases if c.cost_model != "pase" and c.name in outcomes]
    vals = [outcomes[c.name].speedup or 0.0 for c in other]
    right.barh([c.name for c in other], vals, color=["C3" if outcomes[c.name].dp_fits is False else "C0"
                                                      for c in other])
    right.set(xscale="log", xlabel="predicted DP cost / plan cost",
              title="analytic model (red: DP does not fit)")
    right.tick_params(axis="y", labelsize=7)
    right.grid(True, axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    ap.add_argument("--update", action="store_true", help="rewrite benchmarks/baseline.json (needs --reason)")
    ap.add_argument("--reason", help="why the baseline may move (e.g. an intentional cost-model change)")
    ap.add_argument("--fast", action="store_true", help="only the cases marked fast (those the test re-plans)")
    ap.add_argument("--repeat", type=int, default=3, help="plans per case; search times are medians (default 3)")
    ap.add_argument("--only", help="comma-separated case names")
    args = ap.parse_args(argv)
    if args.update and not args.reason:
        ap.error("--update needs --reason \"...\": say why the predicted costs may move")
    cases = [c for c in SUITE if c.fast] if args.fast else SUITE
    if args.only:
        want = set(args.only.split(","))
        cases = [c for c in cases if c.name in want]
    start = time.perf_counter()
    outcomes = run_suite(cases, args.repeat)
    wall = time.perf_counter() - start
    print(f"suite: {len(cases)} cases in {wall:.1f} s wall (repeat {args.repeat})")

    if cases == SUITE:
        write_results(outcomes, SUITE, RESULTS, wall=wall, repeat=args.repeat)
        write_plot(outcomes, SUITE, PLOT)
        print(f"wrote {RESULTS.relative_to(HERE.parent)} and {PLOT.relative_to(HERE.parent)}")
    if args.update:
        lines = update(outcomes, args.reason)
        print(f"updated {BASELINE.relative_to(HERE.parent)}; allowed because: {args.reason}")
        print("\n".join(lines) if lines else "  nothing moved")
        return 0
    if not BASELINE.exists():
        print("no baseline yet: run with --update --reason \"...\"")
        return 0
    problems = compare(load_baseline(), outcomes)
    for p in problems:
        print("REGRESSION " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
