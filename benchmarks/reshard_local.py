"""What a reshard costs a rank beyond its collective, on 2 (``--world``) gloo CPU processes.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.reshard_local [--repeats 31] [--out PATH]

Two parts, each timed on the calling thread's CPU clock (what other processes on a shared host
inflate least; the wall time beside it) and as medians:

* **Pieces in isolation**, interleaved call by call (so that load falls on all alike): the bare
  c10d collectives the collective fit times, the runtime's move (``codegen/moves.py``) of each
  one-axis kind, the runtime's reshard (autograd function) forward, and the local copies alone,
  at three activation sizes of the zoo gpt.
* **Inside training steps**: the zoo gpt's plans of ``benchmarks/cost_vs_measured.py``, each move
  and each collective inside it timed during real steps; the CPU a step spends in its moves
  outside their collectives, against what the profiled model prices as the reshards' local work
  (``cost_models/reshard_fit.py``: its tables with and without it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

SHAPES = [(8, 128, 64), (8, 128, 256), (8, 128, 1024)]  # the gpt's activations: 256 KiB to 4 MiB


def _pieces(rank: int, world: int, repeats: int) -> dict:
    import torch
    import torch.distributed as dist
    from autopar.codegen.moves import move
    from autopar.codegen.runtime import reshard_probe
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Partial, Replicate, Shard

    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    probe = reshard_probe(mesh)
    R, P = Replicate(), Partial()
    kinds = {"S(0)->R": (Shard(0), R), "S(2)->R": (Shard(2), R), "R->S(0)": (R, Shard(0)),
             "R->S(2)": (R, Shard(2)), "P->R": (P, R), "P->S(0)": (P, Shard(0)), "P->S(2)": (P, Shard(2)),
             "S(2)->S(0)": (Shard(2), Shard(0))}
    out = {}
    for shape in SHAPES:
        n = shape[0] * shape[1] * shape[2]
        full, part = torch.randn(n), torch.zeros(n // world)
        ar, rs_out, flat = torch.randn(n), torch.empty(n // world), torch.randn(n)
        src = torch.randn(shape)
        block = torch.randn(world, n // (world * 128), 128)
        ops = {"bare all-gather": lambda: dist.all_gather_single(full, part),
               "bare all-reduce": lambda: dist.all_reduce(ar),
               "bare reduce-scatter": lambda: dist.reduce_scatter_single(rs_out, flat),
               "copy: clone": lambda: src.clone(),
               "copy: blocks side by side": lambda: block.movedim(0, 1).contiguous()}
        for name, (s, d) in kinds.items():
            lshape = list(shape)
            if s.is_shard():
                lshape[s.dim] //= world
            x = torch.randn(lshape)
            ops[f"move {name}"] = lambda x=x, s=s, d=d: move(x, mesh, (s,), (d,))
        xg = torch.randn(shape[0] // world, *shape[1:], requires_grad=True)
        ops["reshard fwd S(0)->R (autograd)"] = lambda: probe(xg)
        for _ in range(3):
            for f in ops.values():
                f()
        ts = {k: [] for k in ops}
        for _ in range(repeats):
            for k, f in ops.items():
                dist.barrier()
                w, c = time.perf_counter(), time.thread_time()
                f()
                ts[k].append((time.perf_counter() - w, time.thread_time() - c))
        out[shape] = {k: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v))
                      for k, v in ts.items()}
    return out


def _in_step(rank: int, world: int, cache: str, repeats: int) -> dict:
    import copy

    import torch
    import torch.distributed as dist

    import autopar
    import autopar.codegen.moves as mv
    import autopar.codegen.runtime as rt
    from autopar.codegen.module import shard_module
    from autopar.codegen.runtime import reshard_probe
    from autopar.cost_models.profiled import ProfiledModel
    from autopar.cost_models.tables import build_tables
    from benchmarks.cost_vs_measured import LR, OPTIMIZER, SIZES, _step, breakdown, strategies

    acc: dict[str, list[float]] = {}

    def timed(key, f):
        def g(*a, **k):
            w, c = time.perf_counter(), time.thread_time()
            r = f(*a, **k)
            x = acc.setdefault(key, [0.0, 0.0, 0])
            x[0] += time.perf_counter() - w
            x[1] += time.thread_time() - c
            x[2] += 1
            return r
        return g

    class Dist:  # moves.py's view of torch.distributed, its collectives timed
        def __getattr__(self, name):
            f = getattr(dist, name)
            return timed("collective", f) if name in ("all_reduce", "all_gather_single",
                                                      "reduce_scatter_single") else f

    rt.move = timed("move", rt.move)
    mv.dist = Dist()
    cluster = autopar.Cluster.preset("cpu", devices=world)
    mesh = cluster.mesh()
    model, inputs = autopar.zoo.get("gpt", **SIZES["gpt"])
    graph = autopar.trace(model, inputs)
    cm = ProfiledModel(cache_path=cache, optimizer=OPTIMIZER, probe=reshard_probe)
    cm.profile(graph, cluster, progress=False)
    tables = build_tables(graph, cluster, cm, space="mesh", mode="train", optimizer="adam")
    bare = copy.copy(cm)
    bare.moves = None
    bare_tables = build_tables(graph, cluster, bare, space="mesh", mode="train", optimizer="adam")
    out = {"fit": (cm.moves.call, cm.moves.copy, cm.moves.strided), "share": cm.share, "plans": {}}
    for label, choice in strategies("gpt", graph, tables, mesh).items():
        assignment = {n: tables.configs[i][c] for i, (n, c) in enumerate(zip(tables.nodes, choice))}
        mod = shard_module(model, graph, assignment, tuple(mesh.shape))
        opt = mod.optimizer(torch.optim.AdamW, lr=LR)
        for _ in range(2):
            dist.barrier()
            _step(mod, opt, inputs)
        rows = []
        for _ in range(repeats):
            acc.clear()
            dist.barrier()
            c = time.thread_time()
            t, _ = _step(mod, opt, inputs)
            acc["step"] = [t, time.thread_time() - c, 1]
            rows.append((t, {k: tuple(v) for k, v in acc.items()}))
        bd = breakdown(graph, tables, choice, cm, cluster)
        out["plans"][label] = dict(predicted=tables.total(choice), bare=bare_tables.total(choice), rows=rows,
                                   compute=(bd["compute"] + bd["optimizer"]) / cm.share)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=31, help="calls per piece (medians)")
    ap.add_argument("--steps", type=int, default=9, help="timed training steps per plan")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--out", default=str(Path(__file__).with_suffix(".md")))
    args = ap.parse_args(argv)

    import os
    import tempfile

    import autopar
    from autopar.cost_models.profiled import ProfiledModel
    from autopar.runtime.allocator import keep_freed_memory
    from autopar.runtime.launch import launch
    from benchmarks.cost_vs_measured import OPTIMIZER, SIZES

    load0 = os.getloadavg()[0]
    start = time.perf_counter()
    pieces = launch(_pieces, args.world, args.repeats, threads=1, timeout=1800)
    keep_freed_memory()  # the profile keeps freed memory as the ranks do (cost_vs_measured)
    cache = str(Path(tempfile.mkdtemp(prefix="autopar-reshard-")) / "profile.sqlite")
    model, inputs = autopar.zoo.get("gpt", **SIZES["gpt"])
    ProfiledModel(cache_path=cache, optimizer=OPTIMIZER).profile(autopar.trace(model, inputs),
                                                                 autopar.Cluster.preset("cpu", devices=args.world))
    steps = launch(_in_step, args.world, cache, args.steps, threads=1, timeout=1800)
    lines = [f"# A reshard's cost beyond its collective ({args.world} gloo CPU processes)", "",
             f"Command: `OMP_NUM_THREADS=1 python -m benchmarks.reshard_local{' ' + ' '.join(argv or sys.argv[1:]) if (argv or sys.argv[1:]) else ''}`; "
             f"1-minute load average {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; took "
             f"{time.perf_counter() - start:.0f} s.", "",
             "## Pieces in isolation", "",
             "Median per call, slower rank; `CPU` is the calling thread's CPU time (gloo's own threads "
             "move the bytes: a collective's CPU here is its call path), `wall` its wall time.", ""]
    for shape in SHAPES:
        mib = shape[0] * shape[1] * shape[2] * 4 / 2 ** 20
        lines += [f"### {shape} float32 ({mib:g} MiB whole)", "", "| piece | CPU ms | wall ms |", "|---|---|---|"]
        for k in pieces[0][shape]:
            w = max(p[shape][k][0] for p in pieces)
            c = max(p[shape][k][1] for p in pieces)
            lines.append(f"| {k} | {1e3 * c:.3f} | {1e3 * w:.3f} |")
        lines.append("")
    call, cp, st = steps[0]["fit"]
    lines += ["## Inside training steps (the zoo gpt of `cost_vs_measured`)", "",
              f"Fitted (`reshard_fit`): {1e6 * call:.1f} us per reshard step of the runtime's path, copies at "
              f"{1e-9 / cp:.2f} GB/s plain and {1e-9 / st:.2f} GB/s strided; the ranks computed "
              f"{steps[0]['share']:.2f}x slower together than alone (`compute_share`).", "",
              "Per step, medians over the steps, slower rank: `moves` how many moves ran (forward and "
              "backward); `local CPU` the CPU the moves spent outside their collectives; `local wall` the "
              "same in wall time; `priced local` what the model adds for it (its prediction with the "
              "term less without); `rest CPU` the step's thread's CPU outside its moves (compute, "
              "optimizer, gradient buckets' calls), beside `priced compute`, the predicted compute and "
              "optimizer update as profiled (on the thread's CPU clock: before `compute_share`); `CPU / priced` the thread's CPU outside the collectives (local + rest) "
              "over what the model prices for it (priced compute + priced local; `before`: priced "
              "compute alone); `predicted` / `before` the step with and without the term, `measured` "
              "its wall time (inflated alike on a loaded host).", "",
              "| plan | moves | local CPU ms | local wall ms | priced local ms | rest CPU ms | priced compute ms | CPU / priced | CPU / priced before | predicted ms | before ms | measured ms | measured / predicted | measured / before |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, row in steps[0]["plans"].items():
        def med(i: int, key: str = "") -> float:
            per = []
            for j in range(args.steps):
                if key:
                    vals = []
                    for s in steps:
                        d = s["plans"][label]["rows"][j][1]
                        m, c = d.get("move", (0.0, 0.0, 0)), d.get("collective", (0.0, 0.0, 0))
                        if key == "rest":  # the step's own thread's CPU outside its moves
                            vals.append(d["step"][1] - m[1])
                        else:
                            vals.append(m[i] - c[i] if i < 2 else m[2])
                    per.append(max(vals))
                else:
                    per.append(max(s["plans"][label]["rows"][j][0] for s in steps))
            return statistics.median(per)
        meas = med(0)
        rest, local, priced = med(1, "rest"), med(1, "c"), row["predicted"] - row["bare"]
        lines.append(f"| {label} | {med(2, 'n'):.0f} | {1e3 * local:.2f} | {1e3 * med(0, 'w'):.2f} | "
                     f"{1e3 * priced:.2f} | {1e3 * rest:.2f} | {1e3 * row['compute']:.2f} | "
                     f"{(local + rest) / (row['compute'] + priced):.2f} | {(local + rest) / row['compute']:.2f} | "
                     f"{1e3 * row['predicted']:.2f} | "
                     f"{1e3 * row['bare']:.2f} | {1e3 * meas:.2f} | {meas / row['predicted']:.2f} | "
                     f"{meas / row['bare']:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
