"""autopar's compiled module beside PyTorch's own implementation of the same strategy, in one run.

    .venv/bin/python -m benchmarks.runtime [--nproc 2 4] [--steps 12] [--warmup 3] [--runs 3] [--no-write]

On ``nproc`` local gloo processes (one thread each, ``OMP_NUM_THREADS=1``), for each model:

* ``DDP``: ``DistributedDataParallel`` on each rank's slice of the batch, vs autopar's
  data-parallel plan (the ``data_parallel`` baseline of its plan, compiled);
* ``TP``: ``parallelize_module`` with ``ColwiseParallel`` on every fc1 and ``RowwiseParallel`` on
  every fc2 (the Megatron MLP; the GPT's fused qkv is not head-aligned for PyTorch's styles, so
  attention stays replicated in both), vs autopar with the same layout pinned (the rest solved
  by its exact DP on the same tables);
* ``FSDP2``: ``fully_shard`` on every block and the root, vs autopar's nearest plan, data parallel
  (autopar's space has no sharded-data parallelism yet);
* autopar's own plan for the ``cpu`` cluster of ``nproc`` devices.

A step is forward + backward + AdamW (``foreach=True``, autopar's ``module.optimizer`` default,
for every implementation but ``parallelize_module``'s, whose mix of plain and DTensor parameters
foreach refuses), fenced by barriers; the variants of a model are built first, in an order drawn
per run (``order_seed``: the run's number, the same on every rank),
and timed in turns (one step of each per round, the order reversed every other round: a slower
spell of the machine falls on all of them alike); the figure is the median of ``steps`` rounds
after ``warmup``, on rank 0, and each cell the median of ``runs`` whole runs. autopar's modules are
compiled with ``inputs="local"`` and fed each rank's slice of the batch, as DDP and FSDP2 are (cut
once, before the steps). Ratios are autopar / PyTorch (lower is better); the predicted
ratio of autopar's own plan over its data-parallel plan sits beside the measured one. The last
column pairs autopar's own plan with the fastest PyTorch variant round by round (``paired_ratio``:
the median over every run's rounds and a 95% bootstrap interval), the measure of "no slower" least
moved by the machine's drift. Results go to ``benchmarks/runtime.md``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "runtime.md"
MODELS = {
    "resmlp": dict(blocks=4, width=512, hidden=2048, batch=64),
    "gpt": dict(layers=2, width=256, heads=4, seq=128, batch=16, vocab=512),
}


def _round_robin(steps_of: dict, steps: int, warmup: int) -> tuple[dict, dict]:
    """Median seconds per step of each variant, timed in turns: one step of each per round (the
    order reversed every other round), so that drift in the machine's speed over the run falls on
    all of them alike rather than on whichever ran last; and every round's seconds (the paired
    ratios of ``paired_ratio``)."""
    import torch.distributed as dist

    labels = list(steps_of)
    for _ in range(warmup):
        for label in labels:
            steps_of[label]()
    times: dict = {label: [] for label in labels}
    for i in range(steps):
        for label in labels if i % 2 == 0 else labels[::-1]:
            dist.barrier()
            t = time.perf_counter()
            steps_of[label]()
            dist.barrier()
            times[label].append(time.perf_counter() - t)
    return {label: statistics.median(ts) for label, ts in times.items()}, times


def _pins(graph, plan, tp_linears: list[str]):
    """autopar's plan with every fc1 column-split and fc2 row-split on the mesh, the rest by DP."""
    import dataclasses

    from autopar.core.tables import restrict
    from autopar.search.dp import dp

    tables = plan.tables
    keep = []
    for i, node in enumerate(graph.nodes):
        cfgs = tables.configs[i]
        want = None
        if node.module in tp_linears:
            kind = "n" if node.module.endswith("fc1") else "k"
            names = [d.name for d in node.dims]
            want = [j for j, c in enumerate(cfgs)
                    if all((s == plan.devices) == (d == kind) or (s == 1 and d != kind)
                           for d, s in zip(names, c.splits))]
        keep.append(want or list(range(len(cfgs))))
    sub = restrict(tables, keep)
    sol = dp(sub)
    choice = [keep[i][c] for i, c in enumerate(sol.choice)]
    assignment = {name: tables.configs[i][c] for i, (name, c) in enumerate(zip(tables.nodes, choice))}
    return dataclasses.replace(plan, assignment=assignment, baselines={}, cost=tables.total(choice))


def worker(rank: int, world: int, steps: int, warmup: int, order_seed: int = 0) -> dict:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    import faulthandler

    faulthandler.dump_traceback_later(float(os.environ.get("RUNTIME_HANG_S", "1800")), exit=True)
    out = {}
    for name, sizes in MODELS.items():
        out[name] = _model_results(name, sizes, rank, world, steps, warmup, order_seed)
        dist.barrier()
    return out


def _model_results(name: str, sizes: dict, rank: int, world: int, steps: int, warmup: int, order_seed: int) -> dict:
    """One model's variants, built in the run's order and timed in turns (on every rank)."""
    import copy

    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    import autopar

    model, inputs = autopar.zoo.get(name, **sizes)
    local = tuple(t.chunk(world)[rank] for t in inputs)
    mlps = [m for m, _ in model.named_modules() if m.endswith("fc1") or m.endswith("fc2")]  # same order on every rank
    best = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=world), pipeline=False,
                        optimizer="adamw")  # the optimizer every step below runs
    tp_plan = _pins(best.graph, best, mlps)
    steps_of = {}

    def add(label, module, batch, step_fn=None):
        # the same AdamW everywhere, foreach on (autopar's module.optimizer default) wherever
        # torch takes it: DDP's plain tensors gain nothing, FSDP2's DTensors gain what autopar's
        # do; parallelize_module leaves plain and DTensor parameters mixed, which foreach
        # refuses, so TP keeps torch's default loop
        kinds = {isinstance(p, DTensor) for p in module.parameters()}
        opt = (module.optimizer(torch.optim.AdamW, lr=1e-4) if hasattr(module, "optimizer")
               else torch.optim.AdamW(module.parameters(), lr=1e-4, foreach=True if len(kinds) == 1 else None))

        def step():
            opt.zero_grad()
            if step_fn is not None:
                step_fn(batch)
            else:
                module(*batch).backward()
            opt.step()

        steps_of[label] = step

    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))

    def build_ddp():
        add("DDP", torch.nn.parallel.DistributedDataParallel(copy.deepcopy(model)), local)

    def build_autopar(label, plan):
        # autopar's modules take each rank's own slice of the batch, as DDP and FSDP2 do
        # (inputs="local": a DistributedSampler's; cut here once, outside the timed steps)
        mod = autopar.compile(model, inputs, plan=plan, inputs="local")
        add(label, mod, mod.local_batch(*inputs)[0], lambda b: mod.train_step(*b))

    def build_tp():
        tp = copy.deepcopy(model)
        parallelize_module(tp, mesh, {m: ColwiseParallel() if m.endswith("fc1") else RowwiseParallel()
                                      for m in mlps})
        add("TP", tp, inputs)

    failed = {}

    def build_fsdp2():
        try:
            from torch.distributed.fsdp import fully_shard

            fs = copy.deepcopy(model)
            for m in fs.modules():
                if type(m).__name__ == "Block":
                    fully_shard(m, mesh=mesh)
            fully_shard(fs, mesh=mesh)
            add("FSDP2", fs, local)
        except Exception as e:  # noqa: BLE001 - report it, keep the other figures
            failed["FSDP2"] = f"failed: {type(e).__name__}: {str(e)[:80]}"

    builders = {"DDP": build_ddp, "autopar DP": lambda: build_autopar("autopar DP", best.baselines["data_parallel"]),
                "TP": build_tp, "autopar TP": lambda: build_autopar("autopar TP", tp_plan),
                "FSDP2": build_fsdp2, "autopar": lambda: build_autopar("autopar", best)}
    # built (and then timed) in an order drawn per run, the same on every rank: a variant
    # built last paid up to 12% in one run (the gpt's own module, the same plan and code as
    # the data-parallel one built second), so no variant keeps one place over the runs
    for label in random.Random(order_seed).sample(list(builders), len(builders)):
        builders[label]()
    medians, rounds = _round_robin(steps_of, steps, warmup)
    results = {**medians, **failed, "rounds": rounds}
    if rank == 0:
        for label, v in medians.items() | failed.items():
            print(f"  {name} {label}: " + (f"{v * 1e3:.1f} ms" if isinstance(v, float) else v), flush=True)
    dp_cost = best.baselines["data_parallel"].cost
    results["predicted speed-up over DP"] = dp_cost / best.cost
    results["predicted TP / DP"] = tp_plan.cost / dp_cost
    results["plan"] = best.search.name
    return results


def table(runs: dict) -> str:
    lines = ["| procs | model | DDP | autopar DP | ratio | TP | autopar TP | ratio | FSDP2 | autopar own plan | "
             "vs fastest PyTorch | autopar TP / DP measured | predicted | "
             "own plan's speed-up over autopar DP measured | predicted | own / fastest per round [95% CI] |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for nproc, per_model in runs.items():
        for name, r in per_model.items():
            ms = {k: v * 1e3 for k, v in r.items() if isinstance(v, float) and "predicted" not in k}
            fsdp = r.get("FSDP2")
            fastest_label = min(("DDP", "TP", "FSDP2"), key=lambda k: ms.get(k, float("inf")))
            fastest = ms[fastest_label]
            fsdp_cell = f"{fsdp * 1e3:.1f}" if isinstance(fsdp, float) else str(fsdp)
            cells = [str(nproc), name, f"{ms['DDP']:.1f}", f"{ms['autopar DP']:.1f}",
                     f"{ms['autopar DP'] / ms['DDP']:.2f}", f"{ms['TP']:.1f}", f"{ms['autopar TP']:.1f}",
                     f"{ms['autopar TP'] / ms['TP']:.2f}", fsdp_cell, f"{ms['autopar']:.1f}",
                     f"{ms['autopar'] / fastest:.2f}", f"{ms['autopar TP'] / ms['autopar DP']:.2f}",
                     f"{r['predicted TP / DP']:.2f}", f"{ms['autopar DP'] / ms['autopar']:.2f}",
                     f"{r['predicted speed-up over DP']:.2f}", _paired_cell(r, fastest_label)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_ratio(rounds: list[dict], label: str, base: str, resamples: int = 2000) -> tuple[float, float, float]:
    """(median, low, high) of ``label``'s step over ``base``'s, round by round (the two timed back
    to back, so a slow spell of the machine falls on both), pooled over the runs; low and high the
    95% bootstrap interval of that median (seeded). Rounds of one run are not independent draws,
    so the interval is a guide to the noise, not a test."""
    import numpy as np

    ratios = np.array([a / b for run in rounds for a, b in zip(run[label], run[base])])
    rng = np.random.default_rng(0)
    meds = np.median(rng.choice(ratios, size=(resamples, len(ratios))), axis=1)
    return float(np.median(ratios)), float(np.quantile(meds, 0.025)), float(np.quantile(meds, 0.975))


def _paired_cell(r: dict, base: str) -> str:
    rounds = r.get("rounds")
    rounds = [rounds] if isinstance(rounds, dict) else rounds  # one run's, or every run's
    if not rounds or base not in rounds[0]:
        return "-"
    m, lo, hi = paired_ratio(rounds, "autopar", base)
    return f"{m:.3f} [{lo:.3f}, {hi:.3f}] vs {base}"


def _median_runs(repeats: list[dict]) -> dict:
    """Each timed cell the median over the runs (a failure text kept as it is); the rounds of
    every run kept, a list of them (``paired_ratio`` pools them)."""
    out = {}
    for name, first in repeats[0].items():
        cell = {}
        for k, v in first.items():
            vals = [r[name][k] for r in repeats]
            if k == "rounds":
                cell[k] = vals
                continue
            cell[k] = statistics.median(vals) if all(isinstance(x, float) for x in vals) else v
        out[name] = cell
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, nargs="*", default=[2, 4])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from autopar.runtime.launch import launch

    runs = {}
    for n in args.nproc:
        repeats = []
        for k in range(args.runs):  # whole runs, fresh processes; each cell the median over them
            repeats.append(launch(worker, n, args.steps, args.warmup, k, timeout=3600)[0])
            print(table({n: repeats[-1]}), flush=True)
        runs[n] = _median_runs(repeats)
    text = table(runs)
    print(text)
    if not args.no_write:
        RESULTS.write_text("# Runtime: autopar beside PyTorch's own parallelism\n\n"
                           "`python -m benchmarks.runtime` (see its docstring); step times in ms, medians of "
                           f"{args.steps} steps after {args.warmup} warm-up steps, each cell the median of "
                           f"{args.runs} whole runs.\n\n" + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
