"""The profiled cost model: compute measured on this device, communication from alpha-beta links.

``AnalyticModel`` guesses a node's compute from datasheet peaks; here each node's *local* work
under a config (operands cut by the splits, see ``op_runner.local_shape``) is run on the real
device, forward and backward, and the median of ``repeats`` runs replaces the two roofline terms.
On a CPU the op runs on one thread and is timed on that thread's CPU clock (``op_runner.clock``),
so other processes on a shared machine do not leak into the cached numbers. In training, the
optimizer's update of the node's local parameter shards is measured too (``optimizer``), and
priced at least at the per-element rate of the whole model's update (``update_timing``: on a live
group, times how much slower the ranks update at once, ``update_share``).
Everything else (weight-gradient syncs, edge reshards, graph outputs) is the analytic model's,
priced on the cluster's links, or on links fitted to the live process group when there is one
(``collective_fit``: an all-reduce timed at a few sizes as the generated module issues it, the
bare c10d call of ``codegen/moves.py`` and of the gradient buckets; a line fitted for alpha and
beta; fitted twice, after 4 and 1 ms of work, and each reshard priced between the two by the
node just before it, ``near_weight``; ``segment_wait`` adds the rest of a longer segment's wait
to a whole plan). The gradient sync is bucketed, as the generated module's reducer runs it.

Timings are cached in SQLite (``profile_cache``) by device, torch version and op signature, so
a second plan of the same model measures nothing. An op the runner cannot rebuild, or one whose
estimate exceeds ``max_estimate`` seconds, keeps the analytic terms and says so in its label.
``benchmarks/cost_vs_measured.py`` checks the predictions against measured gloo step times.
"""

from __future__ import annotations

import dataclasses
import math
import platform
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np
from autopar.cost_models.analytic import AnalyticModel, NodeCost, Term, check_mode
from autopar.cost_models.collective_fit import GAP_S, NEAR_GAP_S, CommFit, compute_share, fit_collectives
from autopar.cost_models.run_share import reference_ops, run_share
from autopar.cost_models.experts import exchange_seconds
from autopar.cost_models.profile_cache import ProfileCache, Timing
from autopar.cost_models.reshard_fit import MoveFit, fit_moves
from autopar.cost_models.segment_wait import Spread, fit_spread
from autopar.cost_models.update_timing import UpdateTiming, update_rate_shapes, update_share
from autopar.core.backward import runs_backward
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



@dataclass
class ProfiledModel(UpdateTiming, AnalyticModel):
    """``AnalyticModel`` with measured compute; see the module docstring.

    ``cache_path``: SQLite file (default ``$AUTOPAR_CACHE`` or ``~/.cache/autopar/profile.sqlite``).
    ``max_estimate``: ops whose analytic forward exceeds this many seconds are not run.
    ``optimizer`` (``adam``, ``adamw``, ``sgd`` or None): the update a training step ends with, timed
    on each node's local parameter shards (``foreach``, as the generated module's ``optimizer()``
    runs it): replicated parameters are updated whole on every device, sharded ones in part.
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
    # the collectives it fits, each on its own line; ``profile`` adds the all-to-all for a graph with experts
    comm_kinds: tuple[str, ...] = ("all-reduce", "all-gather")
    comm_work: str = "mixed"  # what runs between the timed collectives (``compute_segment``)
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
    # the runtime's reshard (``codegen.runtime.reshard_probe``), timed to price a reshard's path
    # beyond its collective; with or without it, the copies around the collective (``reshard_fit``)
    probe: Any = field(default=None, repr=False, compare=False)
    moves: MoveFit | None = field(default=None, init=False)
    # measured compute times this: how much slower ranks sharing a host compute together (``compute_share``)
    share: float = field(default=1.0, init=False)
    # measured updates times this where a live group read it: ranks updating at once (update_timing)
    update_share: float | None = field(default=None, init=False)
    spread: Spread | None = field(default=None, init=False)  # the ranks' drift per segment (segment_wait)
    _reference: Any = field(default=None, init=False, repr=False)  # the model's ops re-timed in a run (run_share)
    _update_shapes: Any = field(default=None, init=False, repr=False)  # (shapes, elements) of the whole update, re-timed in _fit
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
            self.share = (run_share(self, self._reference) if self._reference else None) or compute_share(self.device)
            self.update_share = update_share(self, *self._update_shapes) if self._update_shapes else None
            self.moves = fit_moves(self.probe, self.device)
            self.spread = fit_spread(self.device, work=self.comm_work)
        self._comm_done = True

    @staticmethod
    def _with_links(cluster: Cluster, c: CommFit | None, moves: MoveFit | None = None) -> Cluster:
        if c is None or c.world != cluster.devices:
            return cluster
        m = moves or MoveFit(0.0, 0.0, 0.0)
        return dataclasses.replace(cluster, intra_bandwidth=c.bandwidth, intra_latency=c.latency, call_latency=0.0,
                                   move_call=m.call, copy_time=m.copy, strided_copy_time=m.strided,
                                   inter_bandwidth=c.bandwidth, inter_latency=c.latency,
                                   kind_factors=c.kind_factors())

    def comm_cluster(self, cluster: Cluster) -> Cluster:
        """The cluster with its links replaced by the live process group's fit, if any."""
        self._fit()
        return self._with_links(cluster, self.comm, self.moves)

    def near_weight(self, node: Node, configs: list[Config], cluster: Cluster, backward: bool = False) -> np.ndarray:
        """Per config of ``node``: 0 where a reshard right after its forward (``backward``: after
        its backward) is priced on the near fit (``near_gap`` of compute or less), 1 on the far
        one (``comm_gap`` or more), linear between.

        The wait inside a blocking collective grows with the compute since the ranks last met
        (``fit_collectives``); a reshard comes right after the node that makes its tensor (forward:
        the producer; backward: the consumer, whose input gradient it is).
        A residual MLP of batch 64 whose linears run 1-3 ms measured its tensor-parallel plans
        0.65-0.75x what the 4 ms fit priced, and 1.2-1.35x the 1 ms fit. The one node stands for
        the segment in the search's tables; ``segment_wait`` prices a plan's whole segments.
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
        near = self._with_links(cluster, self.near, self.moves)
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

    def _measure(self, node: Node, config: Config) -> Timing:
        import torch
        from autopar.cost_models.op_runner import NotRunnable, build, time_op

        threads = torch.get_num_threads()
        cpu = torch.device(self.device).type == "cpu"
        if cpu:
            torch.set_num_threads(1)  # one device = one core's worth: no oversubscription noise
        try:
            call = build(node, config, self.device)
            fwd, bwd = time_op(call, runs_backward(node), self.repeats, self.warmup, self.device)
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
        if node.op == "moe_experts" and self.near is not None and self.near.world == cluster.devices:
            near = self._with_links(cluster, self.near, self.moves)  # its back-to-back exchanges (experts.py)
            seconds, f = exchange_seconds(node, config, cluster.mesh(), cluster, mode, near=near)
            nc.terms = [dataclasses.replace(x, seconds=seconds, formula=f if text else "") if x.kind == "exchange"
                        else x for x in nc.terms]
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
        if mode == "train":  # none where autograd records none (core/backward.py), whatever was cached
            measured.append(Term("compute backward (measured)", k * t.backward * runs_backward(node),
                                 f"median(fwd+bwd) - median(fwd) = {t.backward:.4g} s{also}" if text else ""))
        nc.terms = measured + rest
        return nc

    # -- a whole graph up front, with a progress bar ------------------------------------------
    def profile(self, graph: Graph, cluster: Cluster, mode: str = "train", space: str = "mesh",
                progress: bool | None = None) -> int:
        """Measure every (node, config) the tables will ask for; returns how many were run."""
        from autopar.core.space import configs_for

        if "all-to-all" not in self.comm_kinds and any(n.op == "moe_experts" for n in graph.nodes):
            self.comm_kinds = (*self.comm_kinds, "all-to-all")  # expert parallelism's exchange, fitted too
        mesh = cluster.mesh()
        self._reference = reference_ops(graph, mesh, op_signature)  # re-timed by the ranks of a run (_fit)
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
            self._update_shapes = update_rate_shapes(graph) if self.optimizer else None
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
