"""The collectives of the live process group, timed as a step meets them and fitted as links.

``fit_collectives`` times an all-reduce and an all-gather (and, where asked, an all-to-all) at a
few sizes, each after a few milliseconds of compute (``compute_segment``), and fits the ring
formulas' alpha and beta (``CommFit``); ``compute_share`` measures how much slower ranks sharing a host compute together
than alone. ``ProfiledModel`` prices its reshards and gradient buckets on these fits; they are
apart from it because they run collectives on every rank, where the model only reads numbers.
"""

from __future__ import annotations

import gc
import statistics
from dataclasses import dataclass

import numpy as np

@dataclass(frozen=True)
class CommFit:
    """Collective times fitted on ``world`` ranks, as link terms of the ring formulas.

    ``latency``/``bandwidth``: the all-reduce's (``t(N) = 2(p-1) a + 2(p-1)/p N / bw``), the
    links every other kind is priced on; ``gather_latency``/``gather_bandwidth``: the
    all-gather's (``t(N) = (p-1) a + (p-1)/p N / bw``, N the gathered bytes), 0 where not
    fitted. gloo's all-gather moves about half the bytes per second of its all-reduce (2 ranks on
    the benchmark machine: 2 MiB gathered in 4.7-6.5 ms, 2 MiB all-reduced in 3.9 ms), and the
    reshards of a tensor-parallel plan are mostly all-gathers, so one all-reduce fit priced them
    at half their time.
    ``via``: what was timed, ``"dtensor"`` (a DTensor redistribute, whose latency includes
    DTensor's own per-collective overhead) or ``"process_group"`` (the bare c10d call).
    """

    latency: float  # per hop, s
    bandwidth: float  # bytes/s per device, one direction
    world: int
    via: str = "process_group"
    gather_latency: float = 0.0
    gather_bandwidth: float = 0.0
    # the all-to-all's (``t(N) = (p-1) a + (p-1)/p N / bw``, N the bytes one rank sends), 0 where
    # not fitted: expert parallelism's token exchange (``cost_models/experts.py``). gloo's
    # all-to-all is pairwise sends, not a ring: on 4 processes its ~130 KB exchanges cost well
    # under the all-reduce links' ``(p-1)`` latency steps
    all_to_all_latency: float = 0.0
    all_to_all_bandwidth: float = 0.0

    def kind_factors(self) -> tuple[tuple[str, float, float], ...]:
        """``Cluster.kind_factors`` of this fit: the all-gather's and the all-to-all's links over
        the all-reduce's, each where fitted."""
        out = []
        for kind, a, bw in (("all-gather", self.gather_latency, self.gather_bandwidth),
                            ("all-to-all", self.all_to_all_latency, self.all_to_all_bandwidth)):
            if a > 0 and bw > 0:
                out.append((kind, bw / self.bandwidth, a / self.latency))
        return tuple(out)


def _sync(device: str) -> None:
    """Wait for the device's queued work (a CUDA device runs it asynchronously)."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def barrier_median(device: str):
    """``median(f, repeats, warmup)``: the median seconds of ``f`` over ``repeats`` runs, each
    started together on every rank (a barrier before it), the device synced after it."""
    import time

    def sync():
        _sync(device)

    def median(f, repeats: int, warmup: int) -> float:
        import torch.distributed as dist

        for _ in range(warmup):
            f()
        sync()
        ts = []
        for _ in range(repeats):
            dist.barrier()
            t = time.perf_counter()
            f()
            sync()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    return median


def fit_line(sizes, seconds) -> tuple[float, float]:
    """``(c0, c1)`` of ``t = c0 + c1 * N`` by least squares on *relative* error (each point
    weighted by ``1 / t``), so that small messages, where the latency shows, count as much as
    large ones; both clamped positive."""
    x = np.asarray(sizes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    w = 1.0 / np.maximum(t, 1e-12)
    a = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (c0, c1), *_ = np.linalg.lstsq(a, t * w, rcond=None)
    return max(float(c0), 1e-7), max(float(c1), 1e-13)


FIT_KINDS = ("all-reduce", "all-gather", "all-to-all")  # what ``fit_collectives`` can fit, in this order

# the compute before each timed collective (``fit_collectives``): as long as a step's segments
# between blocking collectives are, a few milliseconds (see its docstring)
GAP_S = 4e-3
# and a second, shorter gap: a reshard after a node that computes for less than ``GAP_S`` is
# priced between the two fits (``ProfiledModel.edge_cost``)
NEAR_GAP_S = 1e-3


def fit_collectives(sizes=(2 ** 12, 2 ** 16, 2 ** 18, 2 ** 20, 2 ** 22, 2 ** 24), repeats: int = 7,
                    device: str = "cpu", via: str = "process_group", gap: float = GAP_S,
                    burst: int = 8, kinds=("all-reduce", "all-gather"), work: str = "mixed") -> CommFit | None:
    """Fit alpha and beta of a ring all-reduce and all-gather (and an all-to-all, where ``kinds``
    names it) on the live process group (None without one).

    Every rank must call it (it runs collectives); the fit is all-reduced with MAX so that all
    ranks price plans alike. Each kind gets its own line, ``t = c0 + c1 N`` over the ``sizes``
    (bytes: the all-reduced buffer, the gathered result), turned into the ring model's terms of
    ``comm``: ``c0 = 2(p-1) a``, ``c1 = 2(p-1)/p / bw`` for the all-reduce, ``c0 = (p-1) a``,
    ``c1 = (p-1)/p / bw`` for the all-gather and the all-to-all (N: the bytes one rank sends,
    ``dist.all_to_all_single`` as expert parallelism's exchange runs it, on both ``via``). The
    sizes reach 16 MiB: a gradient bucket is up to 25 MiB, and gloo's bytes per second at 8 MiB
    were half those at 512 KiB, so a fit on small messages alone priced the buckets low.
    Each size is timed as a step meets it (``gap`` > 0, the default): ``burst`` collectives, each
    after about ``gap`` seconds of ``work`` (``compute_segment``: half matmul, half memory-bound
    by default), each collective timed from its call to its return (the wait for a peer still
    computing included, as a step pays it: ``in_step_time``), the median of ``repeats`` such
    bursts' mean. (A burst's time less the work timed alone read the collective as the difference
    of two medians; with other processes on the host the work alone could time longer than in the
    burst, and the difference, clamped, priced every collective at nothing: 2 ranks, load 7 on 2
    cores, the zoo mlp's fit came out 0.0 us and 10,000 GB/s.) A collective alone in a tight loop hides what a step pays: on the benchmarks' machine
    (benchmarks/README.md) a 128 KiB all-reduce took 0.44 ms at the median of a tight loop
    and 1.7 ms in the mean, 2.7 ms after 1 ms of compute (a process that slept in the collective
    is woken, a peer that computed longer is waited for), and the step pays the mean. The wait
    grows with the compute before the collective (the ranks drift apart over it): a 1 MiB
    all-reduce's mean was ~2 ms after gaps of 0.5-2 ms and 3.5-4.8 ms after 4-16 ms, and the
    segments between a step's blocking collectives are a few milliseconds long, so ``gap``
    defaults to ``GAP_S`` (4 ms; a 1 ms gap priced the split plans of
    ``benchmarks/cost_vs_measured.py`` 1.15-1.3x low).
    ``gap=0``: the median of ``repeats`` bare collectives. The line is fitted on relative error
    (``fit_line``).
    ``via="process_group"`` (default) times the bare c10d call (``dist.all_reduce``,
    ``dist.all_gather_into_tensor``), which is what the generated module issues for its gradient
    buckets and for every reshard that changes one mesh axis (``codegen/moves.py``);
    ``via="dtensor"`` times a ``Partial -> Replicate`` (``Shard(0) -> Replicate``) redistribute
    on a 1-D mesh over all ranks, the path of the other reshards (DTensor's dispatch on top).
    """
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    if via not in ("dtensor", "process_group"):
        raise ValueError(f"via must be 'dtensor' or 'process_group', not {via!r}")
    _check_work(work)
    if "all-reduce" not in kinds or not set(kinds) <= set(FIT_KINDS):
        raise ValueError(f"kinds must hold 'all-reduce' and may hold 'all-gather' and 'all-to-all', not {kinds!r}")
    p = dist.get_world_size()
    repeats = max(3, repeats)
    median = barrier_median(device)
    ops, via = _collective_ops(via, device)
    seg = compute_segment(gap, device, work) if gap > 0 else None
    lines = []
    for kind in FIT_KINDS:
        if kind not in kinds:
            lines += [0.0, 0.0]
            continue
        make = ops[kind]
        for _ in range(5):  # connections and first-call costs, before any size is timed
            make(4096)()
        xs, ts = [], []
        for n in sizes:
            op = make(max(4 * p, n))
            if seg is None:
                ts.append(median(op, repeats, 2))
            else:
                ts.append(in_step_time(op, seg, burst, repeats, dist.barrier, lambda: _sync(device)))
            xs.append(float(max(4 * p, n)))
        lines += list(fit_line(xs, ts))
    del ops
    gc.collect()  # DTensors and the mesh go now, not at an exit after the group is destroyed
    fit = torch.tensor(lines, dtype=torch.float64, device=device)
    dist.all_reduce(fit, op=dist.ReduceOp.MAX)
    c0, c1, g0, g1, x0, x1 = (float(x) for x in fit)
    gather = dict(gather_latency=g0 / (p - 1), gather_bandwidth=(p - 1) / p / g1) if g1 > 0 else {}
    if x1 > 0:
        gather.update(all_to_all_latency=x0 / (p - 1), all_to_all_bandwidth=(p - 1) / p / x1)
    return CommFit(latency=c0 / (2 * (p - 1)), bandwidth=2 * (p - 1) / p / c1, world=p, via=via, **gather)


def in_step_time(op, seg, burst: int, repeats: int, barrier, sync, warmup: int = 1, clock=None) -> float:
    """Median over ``repeats`` bursts (each started on every rank together: ``barrier``) of the
    mean seconds of ``op`` from its call to its return, each call after ``seg`` (a step's compute
    between blocking collectives), the device synced before and after each call."""
    import time

    clock = clock or time.perf_counter
    means = []
    for r in range(warmup + repeats):
        barrier()
        total = 0.0
        for _ in range(burst):
            seg()
            sync()
            t = clock()
            op()
            sync()
            total += clock() - t
        if r >= warmup:
            means.append(total / burst)
    return statistics.median(means)


def compute_share(device: str = "cpu", seconds: float = 0.03, repeats: int = 9, work: str = "matmul") -> float:
    """How much slower a rank computes while every rank of the live group computes than alone
    (1.0 without a group; at least 1).

    The profile times each op on one rank with the others idle, on that thread's CPU clock: a
    device's own speed. Where ranks share a host's cores and memory bus they compute at once in a
    step: on the benchmarks' machine (benchmarks/README.md) 2 ranks' training steps ran 1.0-1.05x slower together
    than alone, and with 4 ranks (two on each core) ``benchmarks/cost_vs_measured.py --world 4``
    measured every plan of the gpt 1.5-2.1x its profiled prediction. Timed here on
    ``compute_segment``'s work (``seconds`` of it): rank 0 alone while the others wait in a
    barrier, then every rank at once; the slowest rank's median over rank 0's alone, the same
    figure on every rank (all-reduced). Every rank must call it; on a CPU on one thread, as the
    profile runs each op (2 ranks of 2 threads on the 2 cores read 1.4-1.9). Matmuls by default (three tries
    of 9: 1.00 on 2 ranks, 1.86-1.99 on 4): the mixed segment's 8 MiB streaming pass read
    1.31-1.37 on 2 ranks, where the steps themselves, mostly matmuls in cache, slowed 1.0-1.05x.
    """
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return 1.0
    threads = torch.get_num_threads()
    if torch.device(device).type == "cpu":
        torch.set_num_threads(1)  # as the profile times each op: one core's worth a device
    try:
        return _share(seconds, repeats, device, work)
    finally:
        torch.set_num_threads(threads)


def _share(seconds: float, repeats: int, device: str, work: str) -> float:
    import torch
    import torch.distributed as dist

    median = barrier_median(device)  # barrier-fenced medians, as the collective fit times
    seg = compute_segment(seconds, device, work)
    rank0 = dist.get_rank() == 0
    alone = median(lambda: seg() if rank0 else None, repeats, 1)  # the others wait in the barrier
    together = median(seg, repeats, 1)
    x = torch.tensor([alone if rank0 else 0.0, together], dtype=torch.float64, device=device)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return max(1.0, float(x[1] / x[0]))


def _collective_ops(via: str, device: str) -> tuple[dict, str]:
    """(kind -> (bytes -> a function running that collective once on buffers of that size), what
    is timed: ``via``, or "process_group" where this build has no DTensor)."""
    import torch
    import torch.distributed as dist

    p = dist.get_world_size()

    def buf(nbytes: int):
        return torch.zeros(max(p, nbytes // 4), dtype=torch.float32, device=device)

    def all_reduce(nbytes: int):
        b = buf(nbytes)
        return lambda: dist.all_reduce(b)

    def all_gather(nbytes: int):
        out = buf(nbytes - nbytes % (4 * p))
        part = out.new_zeros(out.numel() // p)
        return lambda: dist.all_gather_into_tensor(out, part)

    def all_to_all(nbytes: int):
        send = buf(nbytes - nbytes % (4 * p))
        got = torch.empty_like(send)
        return lambda: dist.all_to_all_single(got, send)

    bare = {"all-reduce": all_reduce, "all-gather": all_gather, "all-to-all": all_to_all}
    if via == "process_group":
        return bare, via
    try:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    except ImportError:  # no DTensor in this build: the bare collectives
        return bare, "process_group"

    # the default group itself as a 1-D mesh: no new process group to create or tear down
    mesh = DeviceMesh.from_group(dist.group.WORLD, torch.device(device).type)

    def redistribute(src):
        def make(nbytes: int):
            local = buf(nbytes - nbytes % (4 * p))
            if src.is_shard():
                local = local[: local.numel() // p].clone()
            d = DTensor.from_local(local, mesh, [src], run_check=False)

            def once():
                out = d.redistribute(mesh, [Replicate()]).to_local()
                wait = getattr(out, "wait", None)  # an AsyncCollectiveTensor: finish it
                return wait() if callable(wait) else out
            return once
        return make

    # expert parallelism calls the process group's all-to-all itself, whatever the reshards use
    return {"all-reduce": redistribute(Partial()), "all-gather": redistribute(Shard(0)), "all-to-all": all_to_all}, via


GAP_WORK = ("mixed", "matmul")  # what ``compute_segment`` can run between timed collectives


def _check_work(work: str) -> None:
    if work not in GAP_WORK:
        raise ValueError(f"work must be {' or '.join(map(repr, GAP_WORK))}, not {work!r}")


def compute_segment(seconds: float, device: str, work: str = "mixed"):
    """A function of about ``seconds`` of work, the same on every rank (the slowest rank's
    count): what a step computes between two collectives.

    ``work="mixed"`` (default): half matmul, half a memory-bound elementwise pass over 8 MiB, as a
    step alternates linears with norms, activations and softmaxes. A collective after streaming
    work costs more than after a matmul that stays in cache (gloo's copies compete with the peer's
    for the memory bus): on the benchmarks' machine (benchmarks/README.md) the runtime's moves of 0.5-2 MiB took
    1.0-1.7x the matmul-gap fit, 1.2-1.7x the same fit after memory-bound gaps, and 1.3-2.2x
    it inside real training steps. ``work="matmul"``: matmuls alone (the fit before).
    """
    import time

    import torch
    import torch.distributed as dist

    _check_work(work)

    def sync():
        _sync(device)

    x = torch.randn(128, 256, device=device)
    w = torch.randn(256, 256, device=device)
    a = torch.randn(1 << 21, device=device)  # 8 MiB: streams from memory, not from L2
    b = torch.randn(1 << 21, device=device)
    kernels = [lambda: torch.mm(x, w)] + ([lambda: torch.add(a, b, out=a)] if work == "mixed" else [])

    def per_call(f) -> float:
        for _ in range(3):
            f()
        sync()
        t = time.perf_counter()
        for _ in range(20):
            f()
        sync()
        return max((time.perf_counter() - t) / 20, 1e-9)

    share = seconds / len(kernels)
    count = torch.tensor([max(1, round(share / per_call(f))) for f in kernels], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    plan = [(f, int(n)) for f, n in zip(kernels, count.tolist())]

    def segment():
        for f, n in plan:
            for _ in range(n):
                f()
    return segment
