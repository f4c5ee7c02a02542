"""What one gloo collective costs a training step on the local machine, timed three ways.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.gloo_collectives [--procs 2 4] [--sizes-kib 4 128 1024]

On 2 (and 4) local gloo processes, one thread each, for each size and kind (all-reduce,
all-gather, reduce-scatter; sizes are each rank's input):

* ``tight median``: the median of 200 back-to-back calls (what a microbenchmark reports);
* ``tight mean``: their mean (a step pays every call, the slow ones too);
* ``in step``: 40 calls, each after 0.1-3 ms of matmul (the same seeded sequence on every rank,
  1.1 ms on average), minus the matmuls alone, per call; median of 7 such runs. This is what
  ``cost_models.collective_fit.fit_collectives`` times (with 1 ms gaps) and where the ``cpu`` preset's
  link latency comes from (``autopar/core/cluster.py``).

Prints a markdown table; writes nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time


def worker(rank: int, world: int, sizes_kib: list[int]) -> list[tuple]:
    import torch
    import torch.distributed as dist
    from autopar.cost_models.collective_fit import barrier_median

    torch.set_num_threads(1)
    median = barrier_median("cpu")
    x, w = torch.randn(128, 256), torch.randn(256, 256)
    t = time.perf_counter()
    for _ in range(50):
        torch.mm(x, w)
    per = (time.perf_counter() - t) / 50
    rng = random.Random(0)
    counts = torch.tensor([max(1, round(rng.choice([0.1e-3, 0.3e-3, 1e-3, 3e-3]) / per)) for _ in range(40)])
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)  # the same work on every rank
    counts = counts.tolist()

    def compute():
        for c in counts:
            for _ in range(c):
                torch.mm(x, w)

    def in_step(op):
        for c in counts:
            for _ in range(c):
                torch.mm(x, w)
            op()

    alone = median(compute, 7, 1)
    rows = []
    for kib in sizes_kib:
        n = kib * 256  # float32 elements
        buf, big, part = torch.randn(n), torch.empty(n * world), torch.empty(n // world)
        ops = {"all-reduce": lambda buf=buf: dist.all_reduce(buf),
               "all-gather": lambda big=big, buf=buf: dist.all_gather_single(big, buf),
               "reduce-scatter": lambda part=part, buf=buf: dist.reduce_scatter_single(part, buf)}
        for kind, op in ops.items():
            for _ in range(5):
                op()
            dist.barrier()
            tight = []
            for _ in range(200):
                t = time.perf_counter()
                op()
                tight.append(time.perf_counter() - t)
            step = (median(lambda op=op: in_step(op), 7, 1) - alone) / len(counts)
            rows.append((kind, kib, statistics.median(tight), statistics.mean(tight), step))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, nargs="*", default=[2, 4])
    ap.add_argument("--sizes-kib", type=int, nargs="*", default=[4, 128, 1024])
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from autopar.runtime.launch import launch

    print("| procs | collective | KiB per rank | tight median us | tight mean us | in step us |")
    print("|---|---|---|---|---|---|")
    for p in args.procs:
        for kind, kib, med, mean, step in launch(worker, p, args.sizes_kib, timeout=1800)[0]:
            print(f"| {p} | {kind} | {kib} | {med * 1e6:.0f} | {mean * 1e6:.0f} | {step * 1e6:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
