"""How much slower the ranks compute in their run than the profile timed: the model's own ops,
re-timed on every rank at once on the live group, against their cached timings.

The profile times each op in one process (often another one, minutes or days before the run), on
that thread's CPU clock. The ranks of a run compute at once on the host's cores, sharing its
memory bus and last-level cache with each other and with whatever else the host runs at that
moment, so the same op can take longer on a rank's CPU clock than it did in the profile: on the
benchmarks' machine (benchmarks/README.md) every plan of the zoo mlp, the replicated one (no
communication) included, measured 1.09-1.33x its profiled prediction in some invocations of
``benchmarks/cost_vs_measured.py`` and 0.9-1.1x in others, while ``compute_share``'s matmul
segment, timed alone and together in cache, read 1.00 in all of them.

The reference here is the model itself: its nodes under the unsplit config (the replicated plan's
ops, each signature once, weighted by how many nodes run it), the most expensive of them covering
``COVER`` of its profiled forward and backward, re-timed by the same op runner on every rank at
once (each rank the same ops in the same order, after a barrier), on the wall clock, as a step is
timed: where ranks outnumber the cores each runs part of the time (4 ranks on 2 cores: about half),
which the profile's CPU clock does not count (``compute_share``'s segment is on the wall clock for
the same reason). Their sum over the cached sum is this run's compute scale; the slowest rank's (a
step waits for it) is taken, all-reduced so that every rank prices alike. It is a measurement of
this run's conditions, not a constant: where the host runs the ranks as the profile ran, it reads
about 1.

``run_share`` reads it when the live group is fitted, before any step, as the median of
``READINGS`` readings in a row: what a user's plan is priced with. One reading is noisy: the zoo
mlp's plan that communicates nothing measured 0.72-1.23x its prediction from one attempt to the
next on the benchmarks' quiet machine, each priced with its own single reading at the fit, while
its measured step moved by about 1%. The host's speed can also drift while the steps run, so a benchmark that times many
plans over a minute reads the same scale again beside them: ``RoundShare`` re-times the same ops
once per round of the plans' steps, on the same wall clock, and gives the median over the rounds
of the slowest rank's reading. It is still a measurement of the run's conditions, of the model's
own ops alone; it is never fitted to the plans' measured times.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

COVER = 0.9  # share of the model's profiled compute the re-timed ops cover
# readings whose median is the run's scale: one reading of the zoo mlp's ops on the benchmarks'
# two ranks moved 0.99-1.11x from one reading to the next, a second apart, while the replicated
# plan's measured step stayed within 1.3% across six invocations: the single reading, not the
# host, was what moved the plans' prices
READINGS = 5


def reference_ops(graph, mesh, op_signature) -> list[tuple[object, object, int, str]]:
    """(node, its unsplit config on ``mesh``, how many nodes share its op signature, that
    signature: the profile cache's key, ``op_signature(node, config)``), one per signature, in
    graph order."""
    from autopar.core.layout import to_mesh
    from autopar.core.space import configs_for

    out: dict[str, list] = {}
    for n in graph.nodes:
        whole = next((c for c in configs_for(n, mesh, "mesh") if c.devices == 1), None)
        m = to_mesh(whole, mesh) if whole is not None else None
        if m is None:
            continue
        sig = op_signature(n, m)
        if sig in out:
            out[sig][2] += 1
        else:
            out[sig] = [n, m, 1, sig]
    return [tuple(v) for v in out.values()]


def picked_ops(model, ops, cover: float = COVER) -> tuple[list[tuple[object, object, int]], float]:
    """The most expensive of ``ops`` (``reference_ops``) by their cached timings, covering
    ``cover`` of the cached sum, as (node, config, count), and the cached seconds they cover
    (0.0: nothing cached)."""
    cached = []
    for node, config, count, sig in ops:
        t = model.cache.get(model._device, model._torch, sig)
        if t is not None and not t.error:
            cached.append((count * (t.forward + (t.backward or 0.0)), node, config, count))
    cached.sort(key=lambda x: -x[0])
    total = sum(x[0] for x in cached)
    picked, covered = [], 0.0
    for x in cached:
        if covered >= cover * total:
            break
        picked.append((x[1], x[2], x[3]))
        covered += x[0]
    return picked, covered


def slowest_rank(ratio: float, device) -> float:
    """The largest of every rank's ``ratio`` (a step waits for the slowest rank)."""
    import torch
    import torch.distributed as dist

    x = torch.tensor([ratio], dtype=torch.float64, device=device)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return float(x[0])


def in_group() -> bool:
    """Whether a process group of two or more ranks is running (the readings need one)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() >= 2


def run_share(model, ops, cover: float = COVER, readings: int = READINGS) -> float | None:
    """The live group's compute scale against ``model``'s cache (see the module's docstring):
    the median over ``readings`` readings of the slowest rank's; None without a group of two or
    more ranks or without cached timings of ``ops``. Every rank must call it, with the same
    ``ops``."""
    if not in_group():
        return None
    picked, covered = picked_ops(model, ops, cover)
    slowest = []
    for _ in range(max(1, readings)):
        now = _retimed(model, picked)
        slowest.append(slowest_rank(now / covered if covered > 0 and now > 0 else 0.0, model.device))
    return median_share(slowest)  # None where no reading read anything


def _retimed(model, ops, repeats: int | None = None, warmup: int | None = None, barrier: bool = True) -> float:
    """Seconds of ``ops`` (each times its count, forward and backward) timed as the profile times
    them (one thread, ``model.repeats`` runs, the median) but on the wall clock: a step's time is
    wall time, and where ranks outnumber the cores each runs part of the time, which the thread's
    CPU clock the profile reads does not count. Every rank starts together (a barrier) unless
    ``barrier`` is off (the caller has just met the other ranks)."""
    import time

    import torch
    import torch.distributed as dist
    from autopar.cost_models.op_runner import build, time_op

    threads = torch.get_num_threads()
    cpu = torch.device(model.device).type == "cpu"
    if cpu:
        torch.set_num_threads(1)
    total = 0.0
    try:
        if barrier:
            dist.barrier()
        for node, config, count in ops:
            try:
                fwd, bwd = time_op(build(node, config, model.device), True,
                                   model.repeats if repeats is None else repeats,
                                   model.warmup if warmup is None else warmup,
                                   model.device, now=time.perf_counter)
            except Exception:  # an op the runner cannot rebuild here: left out of both sums alike
                return 0.0
            total += count * (fwd + (bwd or 0.0))
    finally:
        if cpu:
            torch.set_num_threads(threads)
    return total


ROUND_REPEATS, ROUND_WARMUP = 1, 1  # each op's runs in one round's reading (the median is over rounds)


@dataclass
class RoundShare:
    """``run_share`` read again in every round of a benchmark's steps (see the module's docstring).

    ``read`` once per round on every rank, right after the ranks meet (each reading times each
    picked op once after one warm-up run, forward and backward); ``share`` at the end, on every
    rank: the median over the rounds of the slowest rank's reading, the same on every rank."""

    model: object
    picked: list
    covered: float  # the picked ops' cached seconds
    readings: list[float] = field(default_factory=list)  # this rank's, one per ``read``

    @classmethod
    def of(cls, model, cover: float = COVER) -> "RoundShare":
        picked, covered = picked_ops(model, model._reference or [], cover)
        return cls(model, picked, covered)

    def read(self) -> float:
        """This rank's ops now over their cached time (0.0: nothing to time)."""
        now = _retimed(self.model, self.picked, ROUND_REPEATS, ROUND_WARMUP, barrier=False) if self.covered > 0 else 0.0
        self.readings.append(now / self.covered if self.covered > 0 else 0.0)
        return self.readings[-1]

    def slowest(self, skip: int = 0) -> list[float]:
        """Per round after the first ``skip``, the slowest rank's reading (every rank must call it)."""
        import torch
        import torch.distributed as dist

        x = torch.tensor(self.readings, dtype=torch.float64, device=self.model.device)
        if in_group():
            dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return [float(v) for v in x[skip:]]

    def share(self, skip: int = 0) -> float | None:
        """``median_share`` of ``slowest(skip)``."""
        return median_share(self.slowest(skip))


def median_share(rounds: list[float]) -> float | None:
    """The median of the rounds' readings that read something; None where none did."""
    kept = [v for v in rounds if v > 0 and math.isfinite(v)]
    return statistics.median(kept) if kept else None
