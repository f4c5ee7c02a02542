"""The profiled cost model: compute measured on this device, communication from alpha-beta links.

``AnalyticModel`` guesses a node's compute from datasheet peaks; here each node's *local* work
under a config (operands cut by the splits, see ``op_runner.local_shape``) is run on the real
device, forward and backward, and the median of ``repeats`` runs replaces the two roofline terms.
On a CPU the op runs on one thread and is timed on that thread's CPU clock (``op_runner.clock``),
so other processes on a shared machine do not leak into the cached numbers. In training, the
optimizer's update of the node's local parameter shards is measured too (``optimizer``), and
priced at least at the per-element rate of the whole model's update (``whole_update_rate``).
Everything else (weight-gradient syncs, edge reshards, graph outputs) is the analytic model's,
priced on the cluster's links, or on links fitted to the live process group when there is one
(``fit_collectives``: an all-reduce timed at a few sizes as the generated module issues it, the
bare c10d call of ``codegen/moves.py`` and of the gradient buckets; a line fitted for alpha and
beta; fitted twice, after 4 and 1 ms of work, and each reshard priced between the two by the
node just before it, ``near_weight``). The gradient sync is the
analytic model's: bucketed, as the generated module's reducer runs it (``core.buckets``).

Timings are cached in SQLite (``profile_cache``) by device, torch version and op signature, so
a second plan of the same model measures nothing. An op the runner cannot rebuild, or one whose
estimate exceeds ``max_estimate`` seconds, keeps the analytic terms and says so in its label.
``benchmarks/cost_vs_measured.py`` checks the predictions against measured gloo step times.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import platform
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np
from autopar.cost_models.analytic import AnalyticModel, NodeCost, Term, check_mode
from autopar.cost_models.profile_cache import ProfileCache, Timing

from autopar.core.cluster import Cluster
from autopar.core.ir import Graph, Node
from autopar.core.layout import NodeLayouts, to_mesh
from autopar.core.strategy import node_training
from autopar.core.tables import Config


def device_name(device: str = "cpu") -> str:
    """What a timing is valid for: the GPU's name, or the CPU's model name and architecture."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return "cuda:" + torch.cuda.get_device_name(dev)
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    # one thread, timed on the thread's CPU clock (op_runner.clock): not comparable with the
    # wall-clock timings earlier versions stored under the bare name
    return f"cpu:{model}:{platform.machine()}:thread-cpu-time"


def op_signature(node: Node, config: Config) -> str:
    """Op, local shapes, dtypes, axis maps and attrs: all a measured time depends on."""
    from autopar.cost_models.op_runner import local_shape

    def spec(s):
        return (local_shape(node, config, s), s.dtype, s.axes)

    params = [spec(p.spec) + ((p.source.rsplit(".", 1)[-1],) if node.op == "batch_norm" else ())
              for p in node.params]
    return repr((node.op, node.target, [spec(o.spec) for o in node.inputs], params,
                 [spec(s) for s in node.outputs], sorted(node.attrs.items(), key=str)))


class Progress:
    """A one-line bar on ``stream``, drawn only when it is a terminal (logs stay clean)."""

    def __init__(self, total: int, label: str = "profiling", stream: TextIO | None = None,
                 enabled: bool | None = None, width: int = 30):
        self.total, self.label, self.done, self.width = total, label, 0, width
        self.stream = stream or sys.stderr
        self.enabled = (self.stream.isatty() if enabled is None else enabled) and total > 0

    def step(self, what: str = "") -> None:
        self.done += 1
        if self.enabled:
            fill = self.width * self.done // self.total
            self.stream.write(f"\r{self.label} [{'#' * fill}{'.' * (self.width - fill)}] "
                              f"{self.done}/{self.total} {what[:30]:<30}")
            if self.done == self.total:
                self.stream.write("\n")
            self.stream.flush()


@dataclass(frozen=True)
class CommFit:
    """Collective times fitted on ``world`` ranks, as link terms of the ring formulas.

    ``latency``/``bandwidth``: the all-reduce's (``t(N) = 2(p-1) a + 2(p-1)/p N / bw``), the
    links every other kind is priced on; ``gather_latency``/``gather_bandwidth``: the
    all-gather's (``t(N) = (p-1) a + (p-1)/p N / bw``, N the gathered bytes), 0 where not
    fitted. gloo's all-gather moves about half the bytes per second of its all-reduce (2 ranks on
    the development machine: 2 MiB gathered in 4.7-6.5 ms, 2 MiB all-reduced in 3.9 ms), and the
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

    def kind_factors(self) -> tuple[tuple[str, float, float], ...]:
        """``Cluster.kind_factors`` of this fit: the all-gather's links over the all-reduce's."""
        if not (self.gather_latency > 0 and self.gather_bandwidth > 0):
            return ()
        return (("all-gather", self.gather_bandwidth / self.bandwidth, self.gather_latency / self.latency),)


def _sync(device: str) -> None:
    """Wait for the device's queued work (a CUDA device runs it asynchronously)."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _timer(device: str):
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


# the compute before each timed collective (``fit_collectives``): as long as a step's segments
# between blocking collectives are, a few milliseconds (see its docstring)
GAP_S = 4e-3
# and a second, shorter gap: a reshard after a node that computes for less than ``GAP_S`` is
# priced between the two fits (``ProfiledModel.edge_cost``)
NEAR_GAP_S = 1e-3


def fit_collectives(sizes=(2 ** 12, 2 ** 16, 2 ** 18, 2 ** 20, 2 ** 22, 2 ** 24), repeats: int = 7,
                    device: str = "cpu", via: str = "process_group", gap: float = GAP_S,
                    burst: int = 8, kinds=("all-reduce", "all-gather"), work: str = "mixed") -> CommFit | None:
    """Fit alpha and beta of a ring all-reduce and all-gather on the live process group (None
    without one).

    Every rank must call it (it runs collectives); the fit is all-reduced with MAX so that all
    ranks price plans alike. Each kind gets its own line, ``t = c0 + c1 N`` over the ``sizes``
    (bytes: the all-reduced buffer, the gathered result), turned into the ring model's terms of
    ``comm``: ``c0 = 2(p-1) a``, ``c1 = 2(p-1)/p / bw`` for the all-reduce, ``c0 = (p-1) a``,
    ``c1 = (p-1)/p / bw`` for the all-gather. The sizes reach 16 MiB: a gradient bucket is up to
    25 MiB, and gloo's bytes per second at 8 MiB were half those at 512 KiB, so a fit on small
    messages alone priced the buckets low.
    Each size is timed as a step meets it (``gap`` > 0, the default): ``burst`` collectives, each
    after about ``gap`` seconds of ``work`` (``_compute_segment``: half matmul, half memory-bound
    by default), minus the work alone, per collective; the median of
    ``repeats`` such bursts. A collective alone in a tight loop hides what a step pays: on the
    2-core development machine a 128 KiB all-reduce took 0.44 ms at the median of a tight loop
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
    if "all-reduce" not in kinds or not set(kinds) <= {"all-reduce", "all-gather"}:
        raise ValueError(f"kinds must hold 'all-reduce' and may hold 'all-gather', not {kinds!r}")
    p = dist.get_world_size()
    repeats = max(3, repeats)
    median = _timer(device)
    ops, via = _collective_ops(via, device)
    seg = _compute_segment(gap, device, work) if gap > 0 else None
    alone = median(lambda: [seg() for _ in range(burst)], repeats, 1) / burst if seg else 0.0
    lines = []
    for kind in ("all-reduce", "all-gather"):
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
                def in_step(op=op):
                    for _ in range(burst):
                        seg()
                        op()
                ts.append(max(median(in_step, repeats, 1) / burst - alone, 1e-7))
            xs.append(float(max(4 * p, n)))
        lines += list(fit_line(xs, ts))
    del ops
    gc.collect()  # DTensors and the mesh go now, not at an exit after the group is destroyed
    fit = torch.tensor(lines, dtype=torch.float64, device=device)
    dist.all_reduce(fit, op=dist.ReduceOp.MAX)
    c0, c1, g0, g1 = (float(x) for x in fit)
    gather = dict(gather_latency=g0 / (p - 1), gather_bandwidth=(p - 1) / p / g1) if g1 > 0 else {}
    return CommFit(latency=c0 / (2 * (p - 1)), bandwidth=2 * (p - 1) / p / c1, world=p, via=via, **gather)


def compute_share(device: str = "cpu", seconds: float = 0.03, repeats: int = 9, work: str = "matmul") -> float:
    """How much slower a rank computes while every rank of the live group computes than alone
    (1.0 without a group; at least 1).

    The profile times each op on one rank with the others idle, on that thread's CPU clock: a
    device's own speed. Where ranks share a host's cores and memory bus they compute at once in a
    step: on the 2-core development machine 2 ranks' training steps ran 1.0-1.05x slower together
    than alone, and with 4 ranks (two on each core) ``benchmarks/cost_vs_measured.py --world 4``
    measured every plan of the gpt 1.5-2.1x its profiled prediction. Timed here on
    ``_compute_segment``'s work (``seconds`` of it): rank 0 alone while the others wait in a
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

    median = _timer(device)  # barrier-fenced medians, as the collective fit times
    seg = _compute_segment(seconds, device, work)
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

    bare = {"all-reduce": all_reduce, "all-gather": all_gather}
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

    return {"all-reduce": redistribute(Partial()), "all-gather": redistribute(Shard(0))}, via


# elements of parameters the whole-update rate is timed on (``ProfiledModel.whole_update_rate``):
# AdamW's state at 16 bytes an element is then 512 MiB, beyond any CPU's last-level cache
UPDATE_RATE_ELEMENTS = 32 * 2 ** 20

GAP_WORK = ("mixed", "matmul")  # what ``_compute_segment`` can run between timed collectives


def _check_work(work: str) -> None:
    if work not in GAP_WORK:
        raise ValueError(f"work must be {' or '.join(map(repr, GAP_WORK))}, not {work!r}")


def _compute_segment(seconds: float, device: str, work: str = "mixed"):
    """A function of about ``seconds`` of work, the same on every rank (the slowest rank's
    count): what a step computes between two collectives.

    ``work="mixed"`` (default): half matmul, half a memory-bound elementwise pass over 8 MiB, as a
    step alternates linears with norms, activations and softmaxes. A collective after streaming
    work costs more than after a matmul that stays in cache (gloo's copies compete with the peer's
    for the memory bus): on the 2-core development machine the runtime's moves of 0.5-2 MiB took
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


@dataclass
class ProfiledModel(AnalyticModel):
    """``AnalyticModel`` with measured compute; see the module docstring.

    ``cache_path``: SQLite file (default ``$AUTOPAR_CACHE`` or ``~/.cache/autopar/profile.sqlite``).
    ``max_estimate``: ops whose analytic forward exceeds this many seconds are not run.
    ``optimizer`` (``adam``, ``adamw``, ``sgd`` or None): the update a training step ends with is
    timed on each node's local parameter shards (``foreach``, as the generated module's
    ``optimizer()`` runs it) and added as a term; replicated parameters are updated whole on every device, sharded ones in part, so this
    is what a data-parallel plan pays and a tensor-parallel one saves.
    ``measurements`` counts ops actually run (0 on a fully cached second run).
    """

    name: str = "profiled"
    cache_path: str | None = None
    device: str = "cpu"
    repeats: int = 5
    warmup: int = 2
    max_estimate: float = 2.0
    fit_comm: bool = True
    comm_via: str = "process_group"  # what ``fit_collectives`` times: "process_group" or "dtensor"
    comm_kinds: tuple[str, ...] = ("all-reduce", "all-gather")  # the collectives it fits, each on its own line
    comm_work: str = "mixed"  # what runs between the timed collectives (``_compute_segment``)
    comm_gap: float = GAP_S  # seconds of it before each (``fit_collectives``)
    near_gap: float | None = NEAR_GAP_S  # a second fit's gap, for reshards after short nodes; None: one fit
    optimizer: str | None = "adam"  # whose update is measured on each node's local params; None: unpriced
    # seconds per parameter element of the whole model's update, timed by ``profile`` (0: not yet)
    update_rate: float = field(default=0.0, init=False)
    measurements: int = field(default=0, init=False)
    fallbacks: dict = field(default_factory=dict, init=False, repr=False)  # signature -> why
    cache: ProfileCache = field(init=False, repr=False)
    comm: CommFit | None = field(default=None, init=False)
    near: CommFit | None = field(default=None, init=False)  # the fit after ``near_gap`` of work
    # measured compute times this: how much slower ranks sharing a host compute together (``compute_share``)
    share: float = field(default=1.0, init=False)
    _evict: Any = field(default=None, init=False, repr=False)  # written before each timed CPU update
    _scalar_update: dict = field(default_factory=dict, init=False, repr=False)  # dtype -> seconds

    def __post_init__(self) -> None:
        import torch

        self.repeats = max(5, self.repeats)
        self.cache = ProfileCache(self.cache_path)
        self._device = device_name(self.device)
        self._torch = torch.__version__
        self._comm_done = not self.fit_comm

    # -- communication -----------------------------------------------------------------------
    def _fit(self) -> None:
        """Fit the links once, on every rank together (each fit runs collectives)."""
        if self._comm_done:
            return
        fit = {"device": self.device, "via": self.comm_via, "kinds": self.comm_kinds, "work": self.comm_work}
        self.comm = fit_collectives(gap=self.comm_gap, **fit)
        if self.comm is not None and self.near_gap is not None and 0 < self.near_gap < self.comm_gap:
            self.near = fit_collectives(gap=self.near_gap, **fit)
        if self.comm is not None:
            self.share = compute_share(self.device)
        self._comm_done = True

    @staticmethod
    def _with_links(cluster: Cluster, c: CommFit | None) -> Cluster:
        if c is None or c.world != cluster.devices:
            return cluster
        return dataclasses.replace(cluster, intra_bandwidth=c.bandwidth, intra_latency=c.latency, call_latency=0.0,
                                   inter_bandwidth=c.bandwidth, inter_latency=c.latency,
                                   kind_factors=c.kind_factors())

    def comm_cluster(self, cluster: Cluster) -> Cluster:
        """The cluster with its links replaced by the live process group's fit, if any."""
        self._fit()
        return self._with_links(cluster, self.comm)

    def near_weight(self, node: Node, configs: list[Config], cluster: Cluster, backward: bool = False) -> np.ndarray:
        """Per config of ``node``: 0 where a reshard right after its forward (``backward``: after
        its backward) is priced on the near fit (``near_gap`` of compute or less), 1 on the far
        one (``comm_gap`` or more), linear between.

        The wait inside a blocking collective grows with the compute since the ranks last met
        (see ``fit_collectives``), and a reshard comes right after the node that makes its tensor:
        in the forward the producer, in the backward the consumer, whose input gradient it is.
        A residual MLP of batch 64 whose linears run 1-3 ms measured its tensor-parallel plans
        0.65-0.75x what the 4 ms fit priced, and 1.2-1.35x the 1 ms fit. The one node stands for
        the segment: the work since the previous collective can be longer, when cheap
        elementwise nodes sit between.
        """
        far, near = self.comm_gap, self.near_gap
        w = np.ones(len(configs))
        mesh = cluster.mesh()
        for i, c in enumerate(configs):
            m = to_mesh(c, mesh)
            # cached timings only: an op left unmeasured (over ``max_estimate``) is not run here
            t = self.cache.get(self._device, self._torch, op_signature(node, m)) if m is not None else None
            if t is not None and not t.error:
                gap = self.share * ((t.backward or 0.0) if backward else t.forward)
                w[i] = min(1.0, max(0.0, (gap - near) / (far - near)))
        return w

    def edge_cost(self, src, src_output, dst, dst_input, src_configs, dst_configs, cluster, mode="train"):
        args = (src, src_output, dst, dst_input, src_configs, dst_configs)
        far = self.comm_cluster(cluster)
        m = super().edge_cost(*args, far, mode)
        if self.near is None or self.near.world != cluster.devices:
            return m
        near = self._with_links(cluster, self.near)
        w_fwd = self.near_weight(src, src_configs, cluster)
        w_bwd = self.near_weight(dst, dst_configs, cluster, backward=True)
        if (w_fwd >= 1.0).all() and (w_bwd >= 1.0).all():
            return m
        short = super().edge_cost(*args, near, mode)
        if check_mode(mode) != "train":
            return np.ascontiguousarray(short + w_fwd[:, None] * (m - short))
        # the forward's move (twice with recompute, as the analytic model counts it) and the
        # gradient's move back, each weighted by the node that runs just before it
        base = super().edge_cost  # (super() does not reach into a generator expression)
        fwd, fwd_short = (base(*args, c, "inference") for c in (far, near))
        if node_training(dst).recompute:
            fwd, fwd_short = 2.0 * fwd, 2.0 * fwd_short
        back, back_short = m - fwd, short - fwd_short
        return np.ascontiguousarray(fwd_short + w_fwd[:, None] * (fwd - fwd_short)
                                    + back_short + w_bwd[None, :] * (back - back_short))

    def output_cost(self, node, output, configs, cluster, mode="train"):
        return super().output_cost(node, output, configs, self.comm_cluster(cluster), mode)

    # -- compute ---------------------------------------------------------------------------
    def timing(self, node: Node, config: Config, estimate: float = 0.0) -> Timing:
        """The cached or freshly measured timing of ``node``'s local op under ``config``."""
        sig = op_signature(node, config)
        hit = self.cache.get(self._device, self._torch, sig)
        if hit is not None:
            return hit
        if estimate > self.max_estimate:
            return Timing(None, None, f"estimate {estimate:.3g} s > max_estimate {self.max_estimate:g} s")
        timing = self._measure(node, config)
        self.measurements += 1
        self.cache.put(self._device, self._torch, sig, timing)
        return timing

    def _optimizer_shapes(self, node: Node, config: Config) -> list[tuple[tuple[int, ...], str]]:
        from autopar.cost_models.op_runner import FLOAT, local_shape

        if not self.optimizer:
            return []
        return [(local_shape(node, config, p.spec), p.spec.dtype) for p in node.params
                if p.spec.dtype in FLOAT]

    def optimizer_signature(self, node: Node, config: Config) -> str | None:
        """The cache key of ``node``'s parameter update under ``config`` (None: nothing to update)."""
        shapes = self._optimizer_shapes(node, config)
        return repr(("optimizer", self.optimizer, "foreach, cold, less a scalar's", shapes)) if shapes else None

    def optimizer_timing(self, node: Node, config: Config) -> Timing | None:
        """The cached or measured update of ``node``'s local float parameters (None: none)."""
        sig = self.optimizer_signature(node, config)
        if sig is None:
            return None
        shapes = self._optimizer_shapes(node, config)
        hit = self.cache.get(self._device, self._torch, sig)
        if hit is not None:
            return hit
        timing = self._measure_optimizer(shapes)
        self.measurements += 1
        self.cache.put(self._device, self._torch, sig, timing)
        return timing

    def whole_update_rate(self, graph: Graph) -> float:
        """Seconds per element of one update of all of ``graph``'s float parameters at once (cached).

        A node's update timed alone (``optimizer_timing``) runs its handful of foreach passes over
        a few MiB that stay in the last-level cache between passes, even when it starts cold. In a
        step the one optimizer walks the whole model's state in each pass, and once that state
        outgrows the cache every pass streams from memory: on the 2-core development machine
        (32 MiB L3) AdamW took 1.8 ns per element over 1 M elements and 3.8-3.9 over 2-8 M, so
        bench-runtime's residual MLP (8.4 M) updated in 33 ms where its nodes timed alone summed
        to 18. The rate is measured on the model's own parameter shapes (the largest first, up
        to ``UPDATE_RATE_ELEMENTS``, past which it no longer changes), the replicated case: a
        sharded plan's smaller state can only stream less, so its nodes are priced at least at
        their own timing and at most at this rate (``_optimizer_terms``).
        """
        from autopar.cost_models.op_runner import FLOAT

        seen: dict[str, tuple[tuple[int, ...], str]] = {}
        for n in graph.nodes:
            for p in n.params:
                if p.spec.dtype in FLOAT:
                    seen[p.source] = (tuple(p.spec.shape), p.spec.dtype)
        if not self.optimizer or not seen:
            return 0.0
        shapes, total = [], 0
        for shape, dtype in sorted(seen.values(), key=lambda s: -math.prod(s[0])):
            room = UPDATE_RATE_ELEMENTS - total
            if room <= 0:
                break
            if math.prod(shape) > room:  # a flat piece instead: no 4 GiB of state for a large embedding
                shape = (room,)
            shapes.append((shape, dtype))
            total += math.prod(shape)
        sig = repr(("optimizer rate", self.optimizer, "foreach, cold, less a scalar's, per element", shapes))
        hit = self.cache.get(self._device, self._torch, sig)
        if hit is None:
            t = self._measure_optimizer(shapes)
            hit = Timing(t.forward / total, 0.0, t.error) if not t.error else t
            self.measurements += 1
            self.cache.put(self._device, self._torch, sig, hit)
        return 0.0 if hit.error else hit.forward

    def _measure_optimizer(self, shapes) -> Timing:
        import torch
        from autopar.cost_models.op_runner import EVICT_BYTES, NotRunnable, time_optimizer

        threads = torch.get_num_threads()
        cpu = torch.device(self.device).type == "cpu"
        if cpu:
            torch.set_num_threads(1)
        try:
            if cpu and self._evict is None:
                self._evict = torch.empty(EVICT_BYTES // 4)
            dtype = shapes[0][1]
            if dtype not in self._scalar_update:
                self._scalar_update[dtype] = time_optimizer(self.optimizer, [((1,), dtype)], self.repeats,
                                                            self.warmup, self.device, self._evict)
            update = time_optimizer(self.optimizer, shapes, self.repeats, self.warmup, self.device, self._evict)
            # what an update of one scalar costs (the step's own Python and a dozen foreach calls,
            # about 0.5 ms here) the model's one optimizer pays once a step, not once per node: the
            # zoo gpt's 16 parameter nodes summed to 13 ms with it, against 5 ms for its whole update
            return Timing(max(update - self._scalar_update[dtype], 0.0), 0.0)
        except NotRunnable as e:
            return Timing(None, None, str(e))
        except Exception as e:
            return Timing(None, None, f"{type(e).__name__}: {str(e)[:120]}")
        finally:
            if cpu:
                torch.set_num_threads(threads)

    def _measure(self, node: Node, config: Config) -> Timing:
        import torch
        from autopar.cost_models.op_runner import NotRunnable, build, time_op

        threads = torch.get_num_threads()
        cpu = torch.device(self.device).type == "cpu"
        if cpu:
            torch.set_num_threads(1)  # one device = one core's worth: no oversubscription noise
        try:
            call = build(node, config, self.device)
            fwd, bwd = time_op(call, True, self.repeats, self.warmup, self.device)
            return Timing(fwd, bwd or 0.0)
        except NotRunnable as e:
            return Timing(None, None, str(e))
        except Exception as e:  # a rebuilt op that torch rejects: price it analytically
            return Timing(None, None, f"{type(e).__name__}: {str(e)[:120]}")
        finally:
            if cpu:
                torch.set_num_threads(threads)

    def node_breakdown(self, node: Node, config: Config, cluster: Cluster, mode: str = "train",
                       text: bool = True, layouts: NodeLayouts | None = None) -> NodeCost:
        mode = check_mode(mode)
        cluster = self.comm_cluster(cluster)
        nc = super().node_breakdown(node, config, cluster, mode, text, layouts)
        if not math.isfinite(nc.seconds):
            return nc
        est = next(t.seconds for t in nc.terms if t.kind == "compute")  # the forward, listed first
        t = self.timing(node, config, est)
        rest = [x for x in nc.terms if x.kind != "compute"]
        if mode == "train" and (measured_step := self._optimizer_terms(node, config, text)):
            # the measured update replaces the analytic estimate (kept where it cannot be timed)
            rest = [x for x in rest if x.kind != "optimizer"] + measured_step
        if t.error:
            why = f"analytic, not measured: {t.error}"
            nc.terms = [dataclasses.replace(x, label=f"{x.label} ({why})")
                        for x in nc.terms if x.kind == "compute"] + rest
            return nc
        k = self.share  # the ranks sharing this host's cores compute at once in a step
        also = f" x {k:.3g} (compute_share)" if k != 1.0 else ""
        measured = [Term("compute forward (measured)", k * t.forward,
                         f"median of {self.repeats} on {self._device} = {t.forward:.4g} s{also}" if text else "")]
        if mode == "train":
            measured.append(Term("compute backward (measured)", k * t.backward,
                                 f"median(fwd+bwd) - median(fwd) = {t.backward:.4g} s{also}" if text else ""))
        nc.terms = measured + rest
        return nc

    def _optimizer_terms(self, node: Node, config: Config, text: bool) -> list[Term]:
        o = self.optimizer_timing(node, config)
        if o is None or o.error:
            return []  # no parameters, or an update the runner cannot time: left unpriced
        why = f"{self.optimizer} update of the local parameter shards, median of {self.repeats} = {o.forward:.4g} s"
        seconds = o.forward
        elements = sum(math.prod(shape) for shape, _ in self._optimizer_shapes(node, config))
        if elements * self.update_rate > seconds:  # the whole model's state streams from memory
            seconds = elements * self.update_rate
            why += (f"; in the whole model's update, {elements} elements x {self.update_rate * 1e9:.3g} ns "
                    f"= {seconds:.4g} s (whole_update_rate)")
        if self.share != 1.0:
            seconds *= self.share
            why += f"; x {self.share:.3g}, the ranks computing at once on this host (compute_share)"
        return [Term("optimizer step (measured)", seconds, why if text else "", "optimizer")]

    # -- a whole graph up front, with a progress bar ------------------------------------------
    def profile(self, graph: Graph, cluster: Cluster, mode: str = "train", space: str = "mesh",
                progress: bool | None = None) -> int:
        """Measure every (node, config) the tables will ask for; returns how many were run."""
        from autopar.core.space import configs_for

        mesh = cluster.mesh()
        todo: dict[str, tuple[Node, Config]] = {}
        for n in graph.nodes:
            for c in configs_for(n, mesh, space):
                m = to_mesh(c, mesh)
                if m is not None:
                    todo.setdefault(op_signature(n, m), (n, m))
                    if mode == "train" and (o := self.optimizer_signature(n, m)) is not None:
                        todo.setdefault(o, (n, m))
        missing = [(n, c) for s, (n, c) in todo.items()
                   if self.cache.get(self._device, self._torch, s) is None]
        before = self.measurements
        if mode == "train":
            self.update_rate = self.whole_update_rate(graph)
        bar = Progress(len(missing), f"profiling {graph.model_name or 'model'}", enabled=progress)
        for n, c in missing:
            self.node_breakdown(n, c, cluster, mode, text=False)
            bar.step(n.name)
        return self.measurements - before


def profiled_model(graph: Graph, cluster: Cluster, mode: str = "train", **kwargs) -> ProfiledModel:
    """A ``ProfiledModel`` with ``graph`` already measured (what ``autopar.plan`` uses)."""
    model = ProfiledModel(**kwargs)
    model.profile(graph, cluster, mode)
    return model
