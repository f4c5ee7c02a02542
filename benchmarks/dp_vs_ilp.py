"""The exact DP against the ILP on PaSE's four graphs at p = 4..64.

    .venv/bin/python -m benchmarks.dp_vs_ilp [--only inception3-p16 ...] [--time-limit 600]
                                            [--max-variables 6000000] [--no-write]

Both searches get the same cost tables (PaSE's cost model and space, PaSE's batch sizes, as
``benchmarks/cases.py``). The ILP runs with its variable limit raised for this benchmark only
(``--max-variables``; the library default stays ``search.ilp.MAX_VARIABLES``) and HiGHS's time
limit at ``--time-limit`` seconds; each case runs in a fresh process so one ILP's memory does not
carry into the next. A row reads "equal" when the two costs agree to 1e-9 relative and the ILP
proved its optimum, "DP <= ILP" when the ILP stopped at its limit with a plan no better than the
DP's, and "DP ABOVE" otherwise (a failure of the DP's exactness). Results go to
``benchmarks/dp_vs_ilp.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "dp_vs_ilp.md"
MODELS = ("alexnet", "inception3", "rnnlm", "transformer")


def case_names() -> list[str]:
    from benchmarks.cases import PASE_DEVICES

    return [f"{m}-p{p}" for m in MODELS for p in PASE_DEVICES]


def child(name: str, time_limit: float, max_variables: int) -> dict:
    import numpy as np

    import autopar
    from autopar.pase import model as pase
    from autopar.search.common import SearchTooLargeError, problem_of
    from autopar.search.dp import dp
    from autopar.search.ilp import ilp
    from benchmarks.cases import PASE_BATCH, PASE_SPACE

    model_name, p = name.rsplit("-p", 1)
    p = int(p)
    model, inputs = autopar.zoo.get(model_name, batch=PASE_BATCH[model_name], device="meta")
    graph = autopar.trace(model, inputs)
    space = PASE_SPACE[model_name]
    kappa = 4 if space == "pase" else int(space.split(":")[1])
    _, tables = pase.tables_for(graph, p, model_name, kappa=kappa, r=pase.rate())
    pr = problem_of(tables)
    variables = sum(pr.sizes) + sum(m.size for m in pr.edges.values()
                                    if not (np.isfinite(m).all() and np.ptp(m) == 0))
    t0 = time.perf_counter()
    d = dp(tables)
    out = {"case": name, "nodes": len(tables.nodes), "variables": variables,
           "dp_cost": d.cost, "dp_s": time.perf_counter() - t0, "dp_gap": d.gap}
    t0 = time.perf_counter()
    try:
        i = ilp(tables, time_limit=time_limit, max_variables=max_variables)
    except SearchTooLargeError:
        out["ilp"] = f"not run: {variables} variables over this run's limit of {max_variables}"
    except TimeoutError:
        out["ilp"] = f"no ILP solution within {time_limit:g} s"
    else:
        out.update(ilp_cost=i.cost, ilp_gap=i.gap, ilp="ok")
    out["ilp_s"] = time.perf_counter() - t0
    out["peak_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    return out


def verdict(r: dict) -> str:
    if r.get("ilp") != "ok":
        return r.get("ilp", "?")
    if r["ilp_gap"] == 0.0:
        return "equal" if math.isclose(r["dp_cost"], r["ilp_cost"], rel_tol=1e-9) else "DP ABOVE" \
            if r["dp_cost"] > r["ilp_cost"] else "ILP ABOVE (ILP proved optimal: check tolerances)"
    return "DP <= ILP (ILP stopped at its limit)" if r["dp_cost"] <= r["ilp_cost"] * (1 + 1e-9) else "DP ABOVE"


def table(rows: list[dict]) -> str:
    lines = ["| case | nodes | ILP variables | DP cost | DP s | ILP cost | ILP gap | ILP s | peak GB | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | | | | | | | | | {r['error']} |")
            continue
        ok = r.get("ilp") == "ok"
        lines.append(
            f"| {r['case']} | {r['nodes']} | {r['variables']:,} | {r['dp_cost']:.12g} | {r['dp_s']:.2f} | "
            f"{r['ilp_cost']:.12g} | {r['ilp_gap']:.2e} | " if ok else
            f"| {r['case']} | {r['nodes']} | {r['variables']:,} | {r['dp_cost']:.12g} | {r['dp_s']:.2f} | - | - | ")
        lines[-1] += f"{r['ilp_s']:.1f} | {r['peak_gb']:.2f} | {verdict(r)} |"
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--time-limit", type=float, default=600.0)
    ap.add_argument("--max-variables", type=int, default=6_000_000)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--child")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.time_limit, args.max_variables)))
        return 0
    rows = []
    for name in args.only or case_names():
        cmd = [sys.executable, "-m", "benchmarks.dp_vs_ilp", "--child", name,
               "--time-limit", str(args.time_limit), "--max-variables", str(args.max_variables)]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.time_limit * 2 + 600)
        except subprocess.TimeoutExpired:
            rows.append({"case": name, "error": "the case did not finish (building the ILP included)"})
        else:
            if res.returncode:
                tail = (res.stderr.strip().splitlines() or ["?"])[-1]
                rows.append({"case": name, "error": f"exit {res.returncode}: {tail[:120]}"})
            else:
                rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = table(rows)
    print(text)
    if not args.no_write:
        RESULTS.write_text(
            "# DP vs ILP on PaSE's graphs\n\n`python -m benchmarks.dp_vs_ilp` (ILP time limit "
            f"{args.time_limit:g} s, variable limit {args.max_variables:,}); see the module docstring.\n\n"
            + text + "\n")
    bad = [r for r in rows if "error" not in r and verdict(r).startswith("DP ABOVE")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
