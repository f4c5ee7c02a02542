"""The analytic cost model: seconds per training step from datasheet numbers and alpha-beta links.

Per node and config (every device does ``1/prod(splits)`` of the node's work):

* compute, forward: a roofline,
  ``max(FLOPs/prod(splits) / (peak[dtype] * compute_efficiency),
        local bytes / (memory_bandwidth * memory_efficiency))``
  where local bytes are the node's ``bytes_read + bytes_written`` scaled by the fraction of its
  operands each device holds under the config's layouts. The byte term keeps a tiny shard of a
  matmul from looking free and prices memory-bound ops (norms, elementwise) at all.
  Plus ``Cluster.op_overhead``, the host's fixed work per op (a CPU's dispatch and the program's
  Python; 0 on the GPU presets, whose launches overlap the device's work).
* compute, backward (training): ``backward_factor`` (2) times the forward: a matmul-like op
  computes two products of the forward's size (input gradient and weight gradient); a
  memory-bound op reads the output gradient and its saved tensors and writes the input gradient,
  about twice the forward's traffic.
* weight gradients (training): a parameter is replicated along every mesh axis that cuts a dim
  not indexing it; its gradient there is a partial sum, all-reduced once per step over that group
  (its local bytes). Mesh axes that cut no dim replicate the whole node: gradients agree, no sync.

Per edge (producer output -> consumer input): the forward reshard from the producer's output layout
(Partial along split reduction dims: this is where a split reduction pays its all-reduce or, when
the consumer wants a shard, its cheaper reduce-scatter) to the consumer's input layout; in
training plus the backward reshard of the gradient, from the consumer's gradient layout (Partial
where the consumer's work differs but it used the whole tensor) to the producer's.

Graph outputs left Partial are all-reduced (forward only).

A training batch norm whose batch dim is split runs with global statistics
(``codegen/batchnorm.py``): two forward all-reduces of its ``C`` (local) channel statistics over
the mesh axes that cut the batch (``bn_stats``); their backward is free. A mean cross-entropy over
class indices with its items split all-reduces their count (``loss_count``), forward only, charged
for what the forward work beside it leaves exposed.

``explain`` prints every term with its arithmetic, so a reader can redo the sum by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from autopar.cost_models.batchnorm_stats import bn_stats, bn_stats_many
from autopar.cost_models.causal_exchange import balance_many, balance_seconds, work_factor
from autopar.cost_models.experts import exchange_many, exchange_seconds
from autopar.cost_models.gathered import gathered_bytes
from autopar.cost_models.loss_count import exposed, lead_seconds, loss_count, loss_count_many
from autopar.cost_models.comm import collective, collective_time, reshard_matrix_codes, reshard_steps
from autopar.cost_models.optimizer_step import local_elements, optimizer_step
from autopar.cost_models.reshard_table import StructureCache
from autopar.cost_models.training import bucket_copy_time, zero_collectives, zero_label, zero_sync_time
from autopar.cost_models.weight_view_sync import lift_weight_view, weight_view_sync

from autopar.core.backward import runs_backward
from autopar.core.buckets import BUCKET_BYTES
from autopar.core.cluster import Cluster
from autopar.core.cost_model import TERM_KINDS, NodeCost, Term  # noqa: F401 (re-exported)
from autopar.core.ir import FLOAT_DTYPES, Node
from autopar.core.layout import (
    Layout,
    NodeLayouts,
    Partial,
    Shard,
    dim_placements,
    format_layout,
    grad_of_input,
    grad_of_output,
    node_layouts,
    owner_matrix,
    shard_factor,
    shard_factors,
    shard_mask,
    tensor_layout,
    tensor_layouts,
    to_mesh,
)
from autopar.core.strategy import node_training
from autopar.core.tables import Config, Mesh
from autopar.core.weight_views import WEIGHT_VIEW, lifted_grad_axes

MODES = ("train", "inference")


def check_mode(mode: str) -> str:
    if mode == "training":
        return "train"
    if mode not in MODES:
        raise ValueError(f"mode must be 'train' or 'inference', not {mode!r}")
    return mode


# Ops that only change a tensor's view (no copy): a traced node with no declared bytes moves none.
VIEW_OPS = {"view", "reshape", "permute", "transpose", "split", "chunk", "slice", "getitem",
            "expand", "squeeze", "unsqueeze", "flatten", "unflatten"}


def _bytes_moved(node: Node, spec_bytes: int) -> int:
    """Declared ``bytes_read + bytes_written``; when none were declared, every operand once
    (hand-built nodes), except for view-only ops, which move nothing."""
    declared = node.bytes_read + node.bytes_written
    if declared or node.flops or node.op not in VIEW_OPS:
        return declared or spec_bytes
    return 0


def _dims_product_text(node: Node) -> str | None:
    """'2·b·s·n·k' when the node's FLOPs are 2 per point of its iteration space, else None."""
    if node.flops and node.flops == 2 * math.prod(d.size for d in node.dims):
        return ("2·" + "·".join(d.name for d in node.dims) + " = 2·"
                + "·".join(str(d.size) for d in node.dims))
    return None


DEFAULT_EFFICIENCY = 0.6  # fraction of peak FLOP/s when neither the model nor the cluster gives one


@dataclass
class AnalyticModel:
    """Roofline compute + ring collectives. Efficiencies are the fraction of peak reached."""

    compute_efficiency: float | None = None  # None: the cluster's figure, else DEFAULT_EFFICIENCY
    memory_efficiency: float = 0.8
    backward_factor: float = 2.0
    compute_dtype: str | None = None  # e.g. "bfloat16" to price an fp32 graph as if under AMP
    # weight of the once-per-step weight-gradient sync in node costs (node_breakdown lists it at
    # 1): the hierarchical search solves tensor groups for per-microbatch time (0) or weighs the
    # sync by 1 / (microbatches + stages - 1), as often as a step pays it against a microbatch
    sync_scale: float = 1.0
    # the optimizer whose update ends a training step ("adam", "adamw", "sgd"; None: unpriced): a
    # memory-bound pass over each device's local parameter elements, so replicated parameters
    # (data parallelism) pay it whole on every device and sharded ones (tensor splits, ZeRO) in part
    optimizer: str | None = None
    name: str = "analytic"
    units: str = "s"
    # Edge tables with equal layouts share their reshard structure (reshard_table.StructureCache,
    # bounded, per instance: build_tables makes one per call, pipeline pricing one for all options).
    reshard_cache: StructureCache = field(default_factory=StructureCache, repr=False, compare=False)

    def efficiency(self, cluster: Cluster) -> float:
        """The fraction of peak FLOP/s compute reaches: the model's own figure when given, else the
        cluster's measured one (``Cluster.compute_efficiency``), else ``DEFAULT_EFFICIENCY``."""
        if self.compute_efficiency is not None:
            return self.compute_efficiency
        return cluster.compute_efficiency or DEFAULT_EFFICIENCY

    # -- per node -------------------------------------------------------------------------
    def node_breakdown(self, node: Node, config: Config, cluster: Cluster, mode: str = "train",
                       text: bool = True, layouts: NodeLayouts | None = None) -> NodeCost:
        """Every term of the node's cost (``layouts``: precomputed ``node_layouts``, for speed)."""
        mode = check_mode(mode)
        mesh = cluster.mesh()
        cfg = to_mesh(config, mesh)
        out = NodeCost(node.name, config)
        if cfg is None:
            out.terms.append(Term("not realizable on the mesh", math.inf, str(config.splits), "infeasible"))
            return out
        lay = layouts or node_layouts(node, cfg, mesh)
        parts = math.prod(cfg.splits) or 1
        dtype = self.compute_dtype or (node.outputs[0].dtype if node.outputs else "float32")
        peak = cluster.peak(dtype)

        specs = [op.spec for op in node.inputs] + [op.spec for op in node.params] + list(node.outputs)
        lays = list(lay.inputs) + list(lay.params) + list(lay.outputs)
        total_spec = sum(s.nbytes for s in specs)
        local_spec = sum(s.nbytes / shard_factor(l, mesh) for s, l in zip(specs, lays))
        moved = _bytes_moved(node, total_spec)
        local_bytes = gathered_bytes(node, cfg.splits, moved, local_spec, total_spec)

        eff = self.efficiency(cluster)
        t_flops = node.flops / parts / (peak * eff) * work_factor(node, cfg.splits)  # balanced causal attention
        t_mem = local_bytes / (cluster.memory_bandwidth * self.memory_efficiency)
        fwd = max(t_flops, t_mem) + cluster.op_overhead
        train = node_training(node)
        f = ""
        if text:
            sym = _dims_product_text(node)
            fl = f"{sym} = {node.flops:.6g}" if sym else f"{node.flops:.6g}"
            over = f" + op overhead {cluster.op_overhead:.3g} s" if cluster.op_overhead else ""
            f = (f"max(FLOPs {fl} / {parts} parts / ({peak:.4g} [{dtype}] * {eff:g})"
                 f" = {t_flops:.4g} s, bytes {local_bytes:.6g} / ({cluster.memory_bandwidth:.4g} * "
                 f"{self.memory_efficiency:g}) = {t_mem:.4g} s){over} = {fwd:.4g} s "
                 f"[{'compute' if t_flops >= t_mem else 'memory'}-bound]")
        out.terms.append(Term("compute forward", fwd, f))
        exchange, f = exchange_seconds(node, cfg, mesh, cluster, mode)
        if exchange:
            out.terms.append(Term("expert parallelism: tokens to their experts' ranks and back", exchange, f,
                                  "exchange"))
        balance, f = balance_seconds(node, cfg, mesh, cluster, mode)
        if balance:
            out.terms.append(Term("causal attention balanced: query rows exchanged and back", balance, f, "exchange"))
        count = loss_count(node, cfg, mesh, cluster)
        if count is not None:  # issued at the targets, waited for at the loss: the forward hides some
            lead = lead_seconds(node, mesh, cluster)
            out.terms.append(Term("loss's count of counted targets (all-reduce, exposed)",
                                  exposed(node, count, mesh, cluster),
                                  f"max(0, {count.formula()} - lead {lead:.4g} s)" if text else "", "stats"))
        if mode == "inference":
            return out
        bf = self.backward_factor if runs_backward(node) else 0.0  # autograd records none (core/backward.py)
        out.terms.append(Term("compute backward", bf * fwd,
                              f"{bf:g} * {fwd:.4g} s = {bf * fwd:.4g} s" if text else ""))
        if train.recompute and not train.kept:  # a kept output (pointwise recompute) is not re-run
            out.terms.append(Term("compute forward again (recomputed in the backward)", fwd,
                                  f"= the forward, {fwd:.4g} s" if text else ""))
        stats = bn_stats(node, cfg, mesh, cluster)
        if stats is not None:
            f = ""
            if text:
                c_local = stats.nbytes / node.inputs[0].spec.itemsize
                f = (f"2 * (N = {c_local:g} channels * {node.inputs[0].spec.itemsize} B; "
                     f"{stats.formula()}) = {2 * stats.seconds:.4g} s")
            out.terms.append(Term("batch-norm statistics (2 all-reduces)", 2 * stats.seconds, f, "stats"))
        groups: dict[tuple[int, ...], list[tuple[str, int, int]]] = {}
        for op, pl in zip(node.params, lay.params):
            if op.spec.dtype not in FLOAT_DTYPES:
                continue  # buffers (masks, counters) have no gradient
            g = grad_of_input(pl, node, cfg, mesh)
            axes = tuple(a for a, x in enumerate(g) if isinstance(x, Partial))
            if axes:
                groups.setdefault(axes, []).append((op.source, op.spec.nbytes, shard_factor(pl, mesh)))
        for axes, params in groups.items():
            nbytes = sum(b / k for _, b, k in params)
            share = min(1.0, nbytes / BUCKET_BYTES)  # the latency, amortized over a bucket
            cs = [(n, collective(kind, nb, axes, mesh, cluster))
                  for kind, n, nb in zero_collectives(train.zero, nbytes, nbytes)]
            if cs[0][1].p > 1:
                copies = sum(n * bucket_copy_time(c.kind, c.nbytes, c.p, cluster) for n, c in cs)
                seconds = sum(n * collective_time(c.kind, c.nbytes, c.p, c.bandwidth, c.latency * share, c.fixed * share)
                              for n, c in cs) + copies
                f = ""
                if text:
                    parts_txt = " + ".join(f"{b}/{k}" if k > 1 else f"{b}" for _, b, k in params)
                    f = (f"N = {parts_txt} = {nbytes:.6g} B ({', '.join(n.removeprefix('param:') for n, _, _ in params)}); "
                         + " + ".join(f"{n} x [{c.formula()}]" if n > 1 else c.formula() for n, c in cs)
                         + (f" + the gradients copied into their bucket {copies:.4g} s" if copies else "")
                         + f"; in buckets of {BUCKET_BYTES / 2**20:g} MiB the latency term counts {share:.4g} "
                         f"of itself = {seconds:.4g} s")
                out.terms.append(Term(zero_label(train.zero), seconds, f, "sync"))
        own = owner_matrix([cfg], mesh)[0]
        step = float(optimizer_step(self.optimizer, node, own, mesh, cluster, self.memory_efficiency)[0])
        if step:
            f = ""
            if text:
                elems = float(local_elements(node, own, mesh)[0])
                how = "torch's foreach passes" if cluster.foreach_update else "one fused kernel"
                f = (f"{elems:.6g} local elements x the bytes {how} moves (training.optimizer_step_time) / "
                     f"({cluster.memory_bandwidth:.4g} * {self.memory_efficiency:g}) = {step:.4g} s")
            out.terms.append(Term(f"{self.optimizer} update of the local parameters", step, f, "optimizer"))
        return out

    def node_cost(self, node: Node, configs: list[Config], cluster: Cluster,
                  mode: str = "train") -> np.ndarray:
        """``node_breakdown(...).seconds`` for every config at once (numpy over configs).

        A subclass that overrides ``node_breakdown`` (the profiled model) gets the per-config
        loop over its own breakdown instead, so the tables always price what it explains.
        """
        mode = check_mode(mode)
        if type(self).node_breakdown is not AnalyticModel.node_breakdown:
            return np.array([self.node_breakdown(node, c, cluster, mode, text=False).seconds
                             for c in configs], dtype=float)
        mesh = cluster.mesh()
        own, ok = owner_matrix(configs, mesh)
        sizes = np.asarray(mesh.shape, dtype=float)
        parts = np.prod(np.where(own >= 0, sizes, 1.0), axis=1)
        dtype = self.compute_dtype or (node.outputs[0].dtype if node.outputs else "float32")
        tensors = ([(op.spec, False) for op in node.inputs] + [(op.spec, False) for op in node.params]
                   + [(s, True) for s in node.outputs])
        total_spec = sum(s.nbytes for s, _ in tensors)
        local_spec = sum(s.nbytes / shard_factors(node, s, own, mesh, out) for s, out in tensors)
        moved = _bytes_moved(node, total_spec)
        local_bytes = gathered_bytes(node, [c.splits for c in configs], moved, local_spec, total_spec)
        t_flops = node.flops / parts / (cluster.peak(dtype) * self.efficiency(cluster))
        if node.op == "sdpa":  # a balanced causal attention's chunks read only the keys they see
            t_flops = t_flops * np.array([work_factor(node, c.splits) for c in configs])
        t_mem = local_bytes / (cluster.memory_bandwidth * self.memory_efficiency)
        cost = np.maximum(t_flops, t_mem) + cluster.op_overhead
        exchange = exchange_many(node, configs, mesh, cluster, mode) + balance_many(node, configs, mesh, cluster, mode)
        count = loss_count_many(node, own, mesh, cluster)
        if mode == "train":
            again = 1.0 if node_training(node).recompute and not node_training(node).kept else 0.0
            sync = self._grad_sync(node, own, mesh, cluster) * self.sync_scale if self.sync_scale else 0.0
            bf = self.backward_factor if runs_backward(node) else 0.0
            cost = (cost * (1.0 + bf + again) + sync + bn_stats_many(node, own, mesh, cluster)
                    + optimizer_step(self.optimizer, node, own, mesh, cluster, self.memory_efficiency))
        return np.where(ok, cost + exchange + count, math.inf)

    def _grad_sync(self, node: Node, own: np.ndarray, mesh: Mesh, cluster: Cluster) -> np.ndarray:
        """Weight-gradient all-reduces per distinct group of mesh axes. The runtime sums them in
        buckets of ``BUCKET_BYTES`` across nodes (``core.buckets``): each node pays its bytes'
        bandwidth and its share of a bucket's latency (a per-node table cannot know how many
        nodes share a bucket; the sum undercounts at most one latency per group of axes)."""
        params = [op for op in node.params if op.spec.dtype in FLOAT_DTYPES]
        out = np.zeros(len(own))
        if not params:
            return out
        sizes = np.asarray(mesh.shape, dtype=float)
        level = np.asarray(mesh.level or (0,) * len(mesh.shape)) > 0
        bits = 2 ** np.arange(len(mesh.shape))
        masks, nbytes = [], []
        for op in params:
            sh = shard_mask(node, op.spec, own)
            partial = (own >= 0) & ~sh  # grad_of_input: Partial along axes cutting other dims
            masks.append(partial @ bits)
            nbytes.append(op.spec.nbytes / np.prod(np.where(sh, sizes, 1.0), axis=1))
        for j, m in enumerate(masks):
            first = np.ones(len(own), dtype=bool)
            for i in range(j):
                first &= masks[i] != m
            bucket = sum(nb * (mk == m) for mk, nb in zip(masks, nbytes))
            axes = (m[:, None] & bits[None, :]) > 0
            p = np.prod(np.where(axes, sizes, 1.0), axis=1)
            cross = (axes & level).any(axis=1)
            bw = np.where(cross, cluster.inter_bandwidth, cluster.intra_bandwidth)
            lat = np.where(cross, cluster.inter_latency, cluster.intra_latency)
            share = np.minimum(1.0, bucket / BUCKET_BYTES)  # the latency, amortized over a bucket
            t = zero_sync_time(node_training(node).zero, bucket, bucket, p, bw, lat * share,
                               cluster=cluster, call_share=share)
            out += np.where(first & (m > 0), t, 0.0)
        return out

    # -- per edge -------------------------------------------------------------------------
    def _edge_layouts(self, src: Node, src_output: int, dst: Node, dst_input: int,
                      src_configs: list[Config], dst_configs: list[Config], mesh: Mesh):
        s_spec = src.outputs[src_output]
        d_spec = dst.inputs[dst_input].spec
        s_cfgs = [to_mesh(c, mesh) for c in src_configs]
        d_cfgs = [to_mesh(c, mesh) for c in dst_configs]
        rep = tuple(Partial() for _ in mesh.shape)  # placeholder for unrealizable configs
        s_ok = iter(tensor_layouts(src, [c for c in s_cfgs if c], s_spec, mesh, output=True))
        d_ok = iter(tensor_layouts(dst, [c for c in d_cfgs if c], d_spec, mesh))
        s_lay = [next(s_ok) if c else rep for c in s_cfgs]
        d_lay = [next(d_ok) if c else rep for c in d_cfgs]
        if s_spec.shape != d_spec.shape:  # a shard of one shape is no shard of another
            d_lay = [_foreign(l) for l in d_lay]
        d_grad = [grad_of_input(l, dst, c, mesh) if c else l for l, c in zip(d_lay, d_cfgs)]
        s_grad = [grad_of_output(l) for l in s_lay]
        return s_spec, s_lay, d_lay, d_grad, s_grad

    def edge_cost(self, src: Node, src_output: int, dst: Node, dst_input: int,
                  src_configs: list[Config], dst_configs: list[Config], cluster: Cluster,
                  mode: str = "train") -> np.ndarray:
        mode = check_mode(mode)
        mesh = cluster.mesh()
        spec = src.outputs[src_output]
        d_spec = dst.inputs[dst_input].spec
        book: dict = {}
        s_codes, _ = _codes(src, spec, True, src_configs, mesh, book, "")
        # a shard of one shape is no shard of another: give the consumer's shards their own codes
        tag = "" if spec.shape == d_spec.shape else "dst"
        d_codes, d_own = _codes(dst, d_spec, False, dst_configs, mesh, book, tag)
        m = reshard_matrix_codes(spec.nbytes, s_codes, d_codes, mesh, cluster, self.reshard_cache)
        if mode == "train" and node_training(dst).recompute:
            m = 2.0 * m  # the consumer's forward, and so its input reshard, runs again in the backward
        if mode == "train" and spec.dtype in FLOAT_DTYPES:
            d_grad = np.where((d_codes == 0) & (d_own >= 0), 1, d_codes)  # grad_of_input
            s_grad = np.where(s_codes == 1, 0, s_codes)  # grad_of_output
            back = reshard_matrix_codes(spec.nbytes, d_grad, s_grad, mesh, cluster, self.reshard_cache).T
            if WEIGHT_VIEW in src.attrs:
                back = lift_weight_view(src, back, s_codes, d_codes, d_grad, mesh, cluster)
            m = m + back
        return np.ascontiguousarray(m)

    def output_cost(self, node: Node, output: int, configs: list[Config], cluster: Cluster,
                    mode: str = "train") -> np.ndarray:
        """A graph output left as partial sums is all-reduced before it is returned."""
        mesh = cluster.mesh()
        spec = node.outputs[output]
        out = np.zeros(len(configs))
        for i, c in enumerate(configs):
            cfg = to_mesh(c, mesh)
            if cfg is None:
                continue
            lay = tensor_layout(node, cfg, spec, mesh, output=True)
            axes = [a for a, x in enumerate(lay) if isinstance(x, Partial)]
            if axes:
                local = spec.nbytes / shard_factor(lay, mesh)
                out[i] = collective("all-reduce", local, axes, mesh, cluster).seconds
        return out

    # -- explanations ---------------------------------------------------------------------
    def explain(self, node: Node, config: Config, cluster: Cluster, mode: str = "train") -> list[str]:
        """Lines a reader can check by hand: every term of the node's cost and its arithmetic."""
        mesh = cluster.mesh()
        nc = self.node_breakdown(node, config, cluster, mode)
        cfg = to_mesh(config, mesh)
        head = f"{node.name} ({node.op}) config splits={config.splits}"
        if cfg is not None:
            head += f" mesh_axes={cfg.mesh_axes}"
            lay = node_layouts(node, cfg, mesh)
            outs = ", ".join(format_layout(l) for l in lay.outputs)
            head += f" -> outputs {outs}"
        lines = [head]
        for t in nc.terms:
            lines.append(f"  {t.label}: {t.formula}")
        lines.append(f"  node total = {nc.seconds:.4g} s")
        return lines

    def explain_edge(self, src: Node, src_output: int, dst: Node, dst_input: int,
                     src_config: Config, dst_config: Config, cluster: Cluster,
                     mode: str = "train") -> tuple[list[str], float]:
        mode = check_mode(mode)
        mesh = cluster.mesh()
        spec, s_lay, d_lay, d_grad, s_grad = self._edge_layouts(
            src, src_output, dst, dst_input, [src_config], [dst_config], mesh)
        lines = [f"{src.name}:{src_output} -> {dst.name}:{dst_input} ({spec.nbytes} B): "
                 f"{format_layout(s_lay[0])} -> {format_layout(d_lay[0])}"]
        steps = reshard_steps(spec.nbytes, s_lay[0], d_lay[0], mesh, cluster)
        lifted = ()
        if mode == "train" and spec.dtype in FLOAT_DTYPES:
            lifted = lifted_grad_axes(src, s_lay[0], d_lay[0], d_grad[0])
            back = [] if lifted else reshard_steps(spec.nbytes, d_grad[0], s_grad[0], mesh, cluster)
            lines[0] += f"; grad {format_layout(d_grad[0])} -> {format_layout(s_grad[0])}"
        else:
            back = []
        again = steps if mode == "train" and node_training(dst).recompute else []
        for tag, ss in (("forward", steps), ("forward again (recomputed)", again), ("backward", back)):
            for s in ss:
                lines.append(f"  {tag}: {s.formula()}")
        total = sum(s.seconds for s in steps + again + back)
        if lifted:
            t, formula = weight_view_sync(src, lifted, mesh, cluster)
            lines.append(f"  backward: {formula}")
            total += t
        if not steps and not back and not lifted:
            lines.append("  layouts agree: no communication")
        lines.append(f"  edge total = {total:.4g} s")
        return lines, total


def _codes(node: Node, spec, output: bool, configs: list[Config], mesh: Mesh, book: dict,
           tag: str) -> tuple[np.ndarray, np.ndarray]:
    """Encoded layouts of one tensor under every config (as ``comm.encode_layouts`` would give),
    and the mesh-axis owner matrix (-1: the axis replicates the node; unrealizable configs are
    all Partial, their node cost is already infinite)."""
    table = []
    for p in dim_placements(node, spec, output):
        table.append(1 if isinstance(p, Partial) else 0 if not isinstance(p, Shard)
                     else book.setdefault((tag, p), 2 + len(book)))
    table.append(0)  # owner -1 -> Replicate
    own, ok = owner_matrix(configs, mesh)
    bad = ~ok
    codes = np.asarray(table, dtype=np.int64)[own]
    codes[bad] = 1
    return codes, own


def _foreign(layout: Layout) -> Layout:
    return tuple(Shard(p.axis + 10_000, p.period) if isinstance(p, Shard) else p for p in layout)
