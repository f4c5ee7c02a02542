"""How steady are the profiled compute totals of the zoo mlp's plans across fresh profiles?

    .venv/bin/python -m benchmarks.profile_steadiness [--repeats 5,15] [--profiles 3]

The mlp's plans of ``benchmarks/cost_vs_measured.py`` are near-ties (five of nine predicted within
20% of each other), so their ranking depends on how steadily the profile times compute. For each
``--repeats`` (the profile's timed runs per op, medians) this profiles the mlp ``--profiles`` times,
each in a fresh cache, and prints per plan its compute and optimizer total in each profile, their
coefficient of variation, and the Spearman correlation of each profile's totals with the first's.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", default="5,15", help="comma-separated profile repeats to compare")
    ap.add_argument("--profiles", type=int, default=3, help="fresh profiles per repeats")
    args = ap.parse_args(argv)

    import autopar
    from autopar.cost_models.profiled import ProfiledModel
    from autopar.cost_models.tables import build_tables
    from autopar.runtime.allocator import keep_freed_memory
    from benchmarks.cost_vs_measured import OPTIMIZER, SIZES, spearman, strategies

    keep_freed_memory()  # as the benchmark profiles
    cluster = autopar.Cluster.preset("cpu", devices=2)
    model, inputs = autopar.zoo.get("mlp", **SIZES["mlp"])
    graph = autopar.trace(model, inputs)
    plans = None
    for repeats in (int(r) for r in args.repeats.split(",")):
        totals, start = [], time.perf_counter()
        for _ in range(args.profiles):
            cm = ProfiledModel(cache_path=str(Path(tempfile.mkdtemp(prefix="autopar-steady-")) / "p.sqlite"),
                               optimizer=OPTIMIZER, repeats=repeats, fit_comm=False)
            cm.profile(graph, cluster, progress=False)
            tables = build_tables(graph, cluster, cm, space="mesh", mode="train", optimizer="adam")
            plans = plans or strategies("mlp", graph, tables, cluster.mesh())
            totals.append({label: sum(t.seconds for i, n in enumerate(graph.nodes)
                                      for t in cm.node_breakdown(n, tables.configs[i][choice[i]], cluster,
                                                                 "train", text=False).terms
                                      if t.kind in ("compute", "optimizer"))
                           for label, choice in plans.items()})
        print(f"repeats {repeats}: {args.profiles} profiles in {time.perf_counter() - start:.0f} s")
        for label in plans:
            v = [t[label] for t in totals]
            print(f"  {label[:30]:30s} ms: " + " ".join(f"{1e3 * x:7.2f}" for x in v)
                  + f"  cv {statistics.pstdev(v) / statistics.mean(v):.3f}")
        first = [totals[0][k] for k in plans]
        print("  Spearman with the first profile:",
              ", ".join(f"{spearman(first, [t[k] for k in plans]):.3f}" for t in totals[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
