"""Each collective of the zoo gpt's plans timed inside real training steps, beside the fits that price it.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.collectives_in_step [--steps 7] [--out PATH]

On 2 gloo CPU processes, the plans of ``benchmarks/cost_vs_measured.py`` (the gpt at its sizes,
profiled afresh, the links fitted on the live group as a run of it does) train a few steps each,
round-robin. Every c10d collective the generated module's moves issue (``codegen/moves.py``:
all-reduce, all-gather, reduce-scatter) is timed from its call to its return, with the wall time
since the previous one returned (the compute segment before it: the ranks drift apart over it).
Per plan and per (kind, bytes): the median measured time and segment, beside the collective as
the backend runs it (``cost_models.alpha_beta.as_run``) priced on the fit after 4 ms of work and
on the one after 1 ms (``ProfiledModel.comm`` and ``near``); the profiled model prices each reshard
between the two by the compute of the one node before it (``near_weight``). Per plan also: the
step's median wall time, the sum of its collectives and the rest, beside the predicted total and
its terms (compute and optimizer update, reshards), and the waits ``segment_wait`` adds to it.
Ratios within one run are what to read on a
shared host: the fits, the compute share and the steps meet the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

PLANS = ("data parallel", "replicated", "column-parallel", "row-parallel", "expert (Megatron)",
         "mixed (dp, then tp)")
KINDS = {"all_reduce": ("all-reduce", 0), "all_gather_single": ("all-gather", 0),
         "reduce_scatter_single": ("reduce-scatter", 1)}  # c10d call -> (kind, the operand whose bytes are N)


def _rank(rank: int, world: int, cache: str, steps: int) -> dict:
    import torch
    import torch.distributed as dist

    import autopar
    import autopar.codegen.moves as mv
    from autopar.codegen.module import shard_module
    from autopar.codegen.runtime import reshard_probe
    from autopar.cost_models.profiled import ProfiledModel
    from autopar.cost_models.segment_wait import segment_waits
    from autopar.cost_models.tables import build_tables
    from benchmarks.cost_vs_measured import LR, OPTIMIZER, SIZES, _step, breakdown, strategies

    log: list[tuple[str, int, float, float]] = []
    last = [time.perf_counter()]

    def timed(kind: str, f, operand: int):
        def call(*a, **k):
            t0 = time.perf_counter()
            r = f(*a, **k)
            t1 = time.perf_counter()
            log.append((kind, a[operand].numel() * a[operand].element_size(), t0 - last[0], t1 - t0))
            last[0] = t1
            return r
        return call

    class Dist:  # moves.py's view of torch.distributed, its collectives timed
        def __getattr__(self, name):
            f = getattr(dist, name)
            return timed(KINDS[name][0], f, KINDS[name][1]) if name in KINDS else f

    cluster = autopar.Cluster.preset("cpu", devices=world)
    mesh = cluster.mesh()
    model, inputs = autopar.zoo.get("gpt", **SIZES["gpt"])
    graph = autopar.trace(model, inputs)
    cm = ProfiledModel(cache_path=cache, optimizer=OPTIMIZER, probe=reshard_probe)
    cm.profile(graph, cluster, progress=False)  # the parent filled the cache: all hits
    tables = build_tables(graph, cluster, cm, space="mesh", mode="train", optimizer="adam")
    mv.dist = Dist()
    out = {"share": cm.share, "plans": {}}
    runs = {}
    for label, choice in strategies("gpt", graph, tables, mesh).items():
        if label.split(" = ")[0] not in PLANS:
            continue
        assignment = {n: tables.configs[i][c] for i, (n, c) in enumerate(zip(tables.nodes, choice))}
        mod = shard_module(model, graph, assignment, tuple(mesh.shape))
        runs[label] = (mod, mod.optimizer(torch.optim.AdamW, lr=LR))
        waits = segment_waits(graph, assignment, cm, cluster)  # the plan's segments' waits beyond their fits
        out["plans"][label] = dict(predicted=tables.total(choice), terms=breakdown(graph, tables, choice, cm, cluster),
                                   wait=waits.seconds, meetings=len(waits.meetings), steps=[])
    for r in range(2 + steps):
        for label, (mod, opt) in runs.items():
            dist.barrier()
            log.clear()
            last[0] = time.perf_counter()
            t, _ = _step(mod, opt, inputs)
            if r >= 2:
                out["plans"][label]["steps"].append((t, list(log)))
    out["prices"] = _prices(cm, cluster, {(k, nb) for p in out["plans"].values() for _, lg in p["steps"]
                                           for k, nb, _, _ in lg})
    return out


def _prices(cm, cluster, keys) -> dict:
    """(kind, bytes) -> seconds on the far and the near fit: the collective as the backend runs it
    plus the reshard's local work (``cost_models.comm.collective``, ``alpha_beta.reshard_local``)."""
    from autopar.cost_models.alpha_beta import reshard_local
    from autopar.cost_models.comm import collective

    out = {}
    for kind, nb in keys:
        row = []
        for fit in (cm.comm, cm.near):
            c = cm._with_links(cluster, fit, cm.moves)
            seconds = collective(kind, float(nb), [0], c.mesh(), c).seconds
            row.append(seconds + reshard_local(kind, float(nb), 2, c))
        out[f"{kind}|{nb}"] = row
    return out


def report(per_rank: list[dict], load: tuple[float, float], took: float) -> list[str]:
    lines = ["# Collectives inside the gpt's steps, beside their prices (2 gloo CPU processes)", "",
             f"Command: `OMP_NUM_THREADS=1 python -m benchmarks.collectives_in_step`; 1-minute load average "
             f"{load[0]:.2f} at the start, {load[1]:.2f} at the end; took {took:.0f} s; the ranks' compute "
             f"share (run_share) {per_rank[0]['share']:.2f}.", ""]
    prices = per_rank[0]["prices"]
    for label, p0 in per_rank[0]["plans"].items():
        plans = [r["plans"][label] for r in per_rank]
        n = len(p0["steps"])
        steps = [max(p["steps"][i][0] for p in plans) for i in range(n)]
        coll = [max(sum(x[3] for x in p["steps"][i][1]) for p in plans) for i in range(n)]
        t = p0["terms"]
        lines += [f"## {label}", "",
                  f"Step: measured {1e3 * statistics.median(steps):.1f} ms, predicted {1e3 * p0['predicted']:.1f} "
                  f"({statistics.median(steps) / p0['predicted']:.2f}x); its collectives measured "
                  f"{1e3 * statistics.median(coll):.1f} ms, the rest {1e3 * statistics.median([s - c for s, c in zip(steps, coll)]):.1f} "
                  f"against compute + update {1e3 * (t['compute'] + t['optimizer']):.1f}, gradient sync "
                  f"{1e3 * t['grad sync']:.1f} and reshards {1e3 * t['edges']:.1f} predicted; the segments' waits "
                  f"beyond their fits {1e3 * p0['wait']:.1f} (meetings: {p0['meetings']}, segment_wait), not in "
                  f"the predicted total.", ""]
        by: dict[tuple, list] = {}
        for p in plans:
            for _, lg in p["steps"]:
                for kind, nb, gap, wall in lg:
                    by.setdefault((kind, nb), []).append((gap, wall))
        if by:
            lines += ["| collective | per step | measured ms (median) | segment before it ms | priced, 4 ms fit | "
                      "priced, 1 ms fit | measured / 4 ms fit |", "|---|---|---|---|---|---|---|"]
        for (kind, nb), v in sorted(by.items()):
            far, near = prices[f"{kind}|{nb}"]
            wall = statistics.median(w for _, w in v)
            lines.append(f"| {kind} {nb / 2 ** 20:.2f} MiB | {len(v) // (len(plans) * n)} | {1e3 * wall:.2f} | "
                         f"{1e3 * statistics.median(g for g, _ in v):.2f} | {1e3 * far:.2f} | {1e3 * near:.2f} | "
                         f"{wall / far:.2f} |")
        lines.append("")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=7, help="timed steps per plan")
    ap.add_argument("--out", default=None, help="write the markdown here (default: print only)")
    args = ap.parse_args(argv)

    import autopar
    from autopar.cost_models.profiled import ProfiledModel
    from autopar.runtime.allocator import keep_freed_memory
    from autopar.runtime.launch import launch
    from benchmarks.cost_vs_measured import OPTIMIZER, SIZES

    load0, start = os.getloadavg()[0], time.perf_counter()
    keep_freed_memory()  # the profile keeps freed memory as the ranks do (cost_vs_measured)
    cache = str(Path(tempfile.mkdtemp(prefix="autopar-coll-")) / "profile.sqlite")
    model, inputs = autopar.zoo.get("gpt", **SIZES["gpt"])
    ProfiledModel(cache_path=cache, optimizer=OPTIMIZER).profile(autopar.trace(model, inputs),
                                                                 autopar.Cluster.preset("cpu", devices=2), progress=False)
    per_rank = launch(_rank, 2, cache, args.steps, threads=1, timeout=3000)
    lines = report(per_rank, (load0, os.getloadavg()[0]), time.perf_counter() - start)
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
