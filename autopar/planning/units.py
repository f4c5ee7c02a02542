"""One tensor-parallel group's exact plan, summed per unit (prologue, each block, epilogue).

The hierarchical search needs, for a tensor group of ``t`` devices and a microbatch of ``b``
sequences, what every unit costs and holds per device. This module prices the whole graph at that
microbatch size on the group's devices (the same cost model and tables as any flat plan), solves it
with the exact DP (identical repeated blocks are solved once: ``search/elimination.py``), and adds
the chosen configs' terms up per unit:

* ``compute``: forward, backward and recomputed forward of the unit's nodes, per microbatch;
* ``comm``: the rest of their per-microbatch cost: the resharding of their inputs (tensor-parallel
  collectives) and graph-output reductions;
* ``sync``: their weight-gradient synchronisation inside the group, once per step;
* memory per device: parameters, gradients, optimizer state (+ master weights) under the group's
  layout (ZeRO over the data-parallel degree is applied by the caller), activations saved per
  microbatch in flight, and ``full_acts``: what a recomputed unit holds while its backward runs;
* ``boundary``: bytes per device crossing the cut after each unit, as Megatron-LM sends them
  (each device of the group one 1/t slice of every crossing tensor, Narayanan et al. 2021, 4.1).

The group's layout minimises the per-microbatch time (``AnalyticModel(sync_scale=0)``: the step's
gradient syncs are priced by the caller) among those that shard every weight matrix over the
group (``model_parallel_space``: what makes it a tensor-parallel group, and what keeps its
parameter memory and gradient bytes at 1/t whatever the choice); memory is checked by the caller on the result.
Beside it, ``sp_acts`` / ``sp_comm``: the same layout under sequence parallelism, every saved
activation kept at 1/t and gathered again in the backward (``sequence_parallel_saved``): the
caller takes it where the plain layout's activations do not fit (``step_price.price_fitting``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from autopar.core.batch import batch_dims, scale_batch
from autopar.core.blocks import Window
from autopar.core.cluster import Cluster
from autopar.core.ir import Graph
from autopar.core.layout import node_layouts, owner_matrix, shard_factor, shard_factors, to_mesh
from autopar.core.space import mesh_configs
from autopar.core.strategy import node_training
from autopar.core.tables import CostTables
from autopar.cost_models.analytic import FLOAT_DTYPES, AnalyticModel
from autopar.cost_models.alpha_beta import collective_time
from autopar.cost_models.backward_set import backward_excess, needs_grad, node_gradients
from autopar.cost_models.memory import already_saved, node_memory, saved_tensors
from autopar.cost_models.tables import build_tables


@dataclass
class UnitStats:
    spans: list[tuple[int, int]]
    compute: np.ndarray  # [U] seconds per microbatch
    comm: np.ndarray  # [U] seconds per microbatch
    sync: np.ndarray  # [U] seconds per step
    params: np.ndarray  # [U] bytes per device
    grads: np.ndarray
    optimizer: np.ndarray
    acts: np.ndarray  # [U] bytes per device per microbatch in flight
    full_acts: np.ndarray  # [U] bytes per device of one microbatch's unit activations, not recomputed
    numel: np.ndarray  # [U] parameter elements per device
    boundary: np.ndarray  # [U-1] bytes per device crossing the cut after unit u
    shared: float  # bytes per device of state the first and last unit both count (tied embeddings)
    graph: Graph  # at microbatch size
    tables: CostTables
    choice: list[int]
    cluster: Cluster  # the tensor group's
    node_map: list[int] | None = None  # full graph node -> node of ``graph`` (a window) that stands for it
    # the same layout with every saved activation kept at 1/t of the group (``sequence_parallel``)
    sp_acts: np.ndarray | None = None  # [U] bytes per device per microbatch in flight
    sp_comm: np.ndarray | None = None  # [U] seconds per microbatch of gathering them again in the backward
    # [U] bytes per device held once, while a loss's backward runs: the gradients it makes
    # (``cost_models.memory``'s ``transient``), beside the stage's activations in flight
    transient: np.ndarray | None = None
    # [U] bools: the units recomputed when only some are (every k-th block, ``planning/every.py``);
    # None: all or none as the candidate's recomputation says
    recomputed: np.ndarray | None = None
    # [U] bytes per device by which a microbatch's backward through the unit rises above the
    # unit's saved activations (its not recomputed ones): a node's gradients beside what is saved
    # up to it (``cost_models/backward_set.py``)
    backward: np.ndarray | None = None
    # [U] bytes per device of the tensors crossing the cut after unit u, in their producer's
    # layout (as a stage sends and holds them for its backward: codegen's ``Boundary``)
    sent: np.ndarray | None = None
    # [U] the part of params / grads / optimizer (bytes) and numel held by nodes without a batch dim
    # (a position table's slice): replicated over the data group with whole gradients, so never
    # synced nor cut by ZeRO (``codegen/zero.py`` slices only the buckets whose gradients are summed
    # over the data axes; ``cost_models.memory`` prices them so on the flat path): ``zero_divided``
    whole_params: np.ndarray | None = None
    whole_grads: np.ndarray | None = None
    whole_optimizer: np.ndarray | None = None
    whole_numel: np.ndarray | None = None

    @property
    def time(self) -> np.ndarray:
        return self.compute + self.comm


def group_cluster(cluster: Cluster, tensor: tuple[int, ...]) -> Cluster:
    """The devices of one tensor group: ``tensor[0]`` per node, ``tensor[1]`` nodes; its mesh has
    the in-node prime axes and one axis across its nodes (a cross-node split takes them all)."""
    t = math.prod(tensor)
    return dataclasses.replace(cluster, devices=t, devices_per_node=tensor[0], nodes_per_pod=0, node_axis=True,
                               name=f"{cluster.name} tensor group of {t}")


def unit_stats(graph: Graph, spans: list[tuple[int, int]], cluster: Cluster, tensor: tuple[int, ...],
               microbatches: int, model: AnalyticModel, solve, mode: str = "train",
               optimizer: str | None = "adam", window: Window | None = None,
               tables: CostTables | None = None) -> UnitStats:
    """Price and solve ``graph`` (already under its training options) for one tensor group at
    ``1/microbatches`` of its batch; ``solve(tables, graph) -> Solution`` is the exact search (the
    graph: the one the tables price, for searches that read it: ``planner.run_search``) and
    ``model`` what it minimises (per-microbatch time: ``sync_scale=0``); the figures are priced
    at face value.

    With a ``window`` (``core.blocks.block_window``), the window is solved instead and its units'
    figures stand for the full graph's: every middle block takes the window's middle block's
    layout (repeated layers solved once; the first and last blocks keep their own). ``tables``:
    the graph's (or window's) tables at this microbatch when already built (``planning/every.py``)."""
    if window is not None:
        s = unit_stats(window.graph, window.spans, cluster, tensor, microbatches, model, solve, mode, optimizer,
                       tables=tables)
        take = np.asarray(window.unit_map, dtype=np.intp)
        cuts = s.boundary[take[:-1]] if len(take) > 1 else s.boundary[:0]
        return dataclasses.replace(
            s, spans=spans, compute=s.compute[take], comm=s.comm[take], sync=s.sync[take], params=s.params[take],
            grads=s.grads[take], optimizer=s.optimizer[take], acts=s.acts[take], full_acts=s.full_acts[take],
            numel=s.numel[take], boundary=cuts, node_map=list(window.node_map), sp_acts=s.sp_acts[take],
            sp_comm=s.sp_comm[take], transient=s.transient[take] if s.transient is not None else None,
            backward=s.backward[take] if s.backward is not None else None,
            sent=s.sent[take] if s.sent is not None else None,
            **{f: getattr(s, f)[take] for f in WHOLE if getattr(s, f) is not None})
    sub = group_cluster(cluster, tensor)
    g = scale_batch(graph, microbatches)
    if tables is None:
        tables = build_tables(g, sub, model, space=model_parallel_space(g), mode=mode, optimizer=optimizer)
        tables.memory_capacity = math.inf
    choice = solve(tables, g).choice
    mesh = sub.mesh()
    n = len(g.nodes)
    into = np.zeros(n)
    for (u, v), m in tables.edge_cost.items():
        into[v] += float(m[choice[u], choice[v]])
    outputs: dict[str, list[int]] = {}
    for name, k in g.outputs:
        outputs.setdefault(name, []).append(k)
    unit_of = np.empty(n, dtype=np.intp)
    for k, (a, b) in enumerate(spans):
        unit_of[a:b] = k
    U = len(spans)
    out = {k: np.zeros(U) for k in ("compute", "comm", "sync", "params", "grads", "optimizer", "acts",
                                    "full_acts", "numel", "sp_acts", "sp_comm", "transient", *WHOLE)}
    no_batch = {name for name, dim in batch_dims(g).items() if dim is None}
    link = sub.link(len(tensor) > 1 and tensor[1] > 1)
    price = AnalyticModel(compute_efficiency=model.compute_efficiency, memory_efficiency=model.memory_efficiency,
                          backward_factor=model.backward_factor)  # the terms at face value
    cache: dict[tuple, tuple] = {}
    dup = already_saved(g)
    seen_in_unit: list[set[str]] = [set() for _ in range(U)]
    param_units: dict[str, set[int]] = {}
    state_of: dict[tuple[str, int], float] = {}
    grad = needs_grad(g)
    saved_in_unit: list[list[float]] = [[] for _ in range(U)]
    grads_in_unit: list[list[float]] = [[] for _ in range(U)]
    out_bytes: dict[tuple[str, int], float] = {}
    for i, node in enumerate(g.nodes):
        u = int(unit_of[i])
        cfg = tables.configs[i][choice[i]]
        skip = frozenset(p.source for p in node.params if p.source in seen_in_unit[u])
        shared = dup.get(node.name, frozenset())
        key = (id(tables.configs[i]), choice[i], skip, shared)
        if key not in cache:
            nc = price.node_breakdown(node, cfg, sub, mode, text=False)
            comp = sum(t.seconds for t in nc.terms if t.kind == "compute")
            sync = sum(t.seconds for t in nc.terms if t.kind == "sync")
            other = sum(t.seconds for t in nc.terms if t.kind not in ("compute", "sync"))
            mb = node_memory(node, cfg, mesh, mode, optimizer, skip, shared=shared)
            full = mb.activations
            if node_training(node).recompute:
                rec = dataclasses.replace(node_training(node), recompute=False)
                plain = dataclasses.replace(node, attrs={**node.attrs, "train": rec})
                full = node_memory(plain, cfg, mesh, mode, optimizer, skip, shared=shared).activations
            mcfg = to_mesh(cfg, mesh)
            lay = node_layouts(node, mcfg, mesh)
            numel = sum(op.spec.numel / shard_factor(pl, mesh) for op, pl in zip(node.params, lay.params)
                        if op.source not in skip and op.spec.dtype in FLOAT_DTYPES)
            per_param = {op.source: (mb.params + mb.grads + mb.optimizer) * (op.spec.numel / shard_factor(pl, mesh))
                         / numel if numel else 0.0
                         for op, pl in zip(node.params, lay.params) if op.spec.dtype in FLOAT_DTYPES}
            sp = sequence_parallel_saved(node, cfg, sub, mesh, link, mode, shared)
            grads = node_gradients(node, lay, mesh, grad) if mode == "train" else 0.0
            local = [spec.nbytes / shard_factor(pl, mesh) for spec, pl in zip(node.outputs, lay.outputs)]
            cache[key] = (comp, sync, other, mb, full, numel, per_param, sp, grads, local)
        comp, sync, other, mb, full, numel, per_param, sp, grads, local = cache[key]
        saved_in_unit[u].append(full)
        grads_in_unit[u].append(grads)
        out_bytes.update(((node.name, k), b) for k, b in enumerate(local))
        red = sum(float(price.output_cost(node, k, [cfg], sub, mode)[0]) for k in outputs.get(node.name, ()))
        out["compute"][u] += comp
        out["sync"][u] += sync
        out["comm"][u] += other + red + into[i]
        out["params"][u] += mb.params
        out["grads"][u] += mb.grads
        out["optimizer"][u] += mb.optimizer
        out["acts"][u] += mb.activations
        out["full_acts"][u] += full
        out["sp_acts"][u] += sp[0]
        out["sp_comm"][u] += sp[1]
        out["transient"][u] += mb.transient
        out["numel"][u] += numel
        if node.name in no_batch:
            for f, v in zip(WHOLE, (mb.params, mb.grads, mb.optimizer, numel)):
                out[f][u] += v
        for op in node.params:
            seen_in_unit[u].add(op.source)
            param_units.setdefault(op.source, set()).add(u)
            if op.source in per_param:
                state_of.setdefault((op.source, u), per_param[op.source])
    shared = 0.0
    if U > 1:
        shared = sum(state_of.get((src, 0), 0.0) for src, us in param_units.items() if 0 in us and U - 1 in us)
    return UnitStats(spans, out["compute"], out["comm"], out["sync"], out["params"], out["grads"],
                     out["optimizer"], out["acts"], out["full_acts"], out["numel"],
                     crossing_bytes(g, spans) / sub.devices, shared, g, tables, choice, sub,
                     sp_acts=out["sp_acts"], sp_comm=out["sp_comm"],
                     transient=out["transient"], **{f: out[f] for f in WHOLE},
                     backward=np.array([backward_excess(a, b) for a, b in zip(saved_in_unit, grads_in_unit)]),
                     sent=np.append(crossing_bytes(g, spans, out_bytes), 0.0))


WHOLE = ("whole_params", "whole_grads", "whole_optimizer", "whole_numel")


def zero_divided(s: UnitStats, fp: float, fg: float, fo: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """[U] parameters, gradients, optimizer state (bytes) and stepped elements per device under
    ZeRO's divisors (``fp``, ``fg``, ``fo``: by what it divides each), the state of nodes without
    a batch dim kept whole (``UnitStats.whole_*``), as the flat path and codegen hold them."""
    w = [getattr(s, f) if getattr(s, f) is not None else 0.0 for f in WHOLE]
    return ((s.params - w[0]) / fp + w[0], (s.grads - w[1]) / fg + w[1], (s.optimizer - w[2]) / fo + w[2],
            (s.numel - w[3]) / fo + w[3])


def sequence_parallel_saved(node, cfg, group: Cluster, mesh, link: tuple[float, float], mode: str,
                            shared: frozenset[int]) -> tuple[float, float]:
    """(bytes, seconds per microbatch) of the node's saved activations under sequence parallelism
    (Korthikanti et al. 2022, 4.2.2): every tensor the backward reads is kept at 1/t of the group
    (split along the sequence where the layout keeps it whole: a norm's input, a column-parallel
    linear's gathered input) and a tensor the layout reads less split is all-gathered again before
    its backward (Megatron-LM re-gathers the linear's input). The forward's layout and its
    collectives are the group's own (a reduce-scatter + all-gather pair moves what an all-reduce
    does)."""
    t = group.devices
    bw, lat = link
    kept, gather = 0.0, 0.0
    for nbytes, k in saved_tensors(node, cfg, mesh, mode, shared):
        kept += nbytes / t
        if k < t:
            gather += collective_time("all-gather", nbytes / k, t // k, bw, lat, group.call_latency)
    return kept, gather


def model_parallel_space(graph: Graph):
    """The tensor group's space: it parallelises the model, as tensor parallelism does: no split of
    the batch (data parallelism is the search's data degree, where its sync and ZeRO are priced),
    and every weight matrix (a floating-point parameter of two or more axes) sharded over all of
    the group's devices where some config of its node can (Megatron-LM's rule; the choice left is
    how: by rows, columns, heads, vocabulary). Norm scales and biases may stay replicated."""
    batch = batch_dims(graph)

    def space(node, mesh):
        configs = mesh_configs(node, mesh)
        b = batch.get(node.name)
        if b is not None:
            k = [d.name for d in node.dims].index(b)
            configs = [c for c in configs if c.splits[k] == 1] or configs
        weights = [op.spec for op in node.params if op.spec.dtype in FLOAT_DTYPES and len(op.spec.shape) >= 2]
        if weights and mesh.size > 1:
            own, _ = owner_matrix(configs, mesh)
            full = np.ones(len(configs), dtype=bool)
            for spec in weights:
                full &= shard_factors(node, spec, own, mesh) == mesh.size
            if full.any():
                configs = [c for c, ok in zip(configs, full) if ok]
        return configs

    return space


def crossing_bytes(graph: Graph, spans: list[tuple[int, int]], local: dict | None = None) -> np.ndarray:
    """Bytes of the tensors crossing the cut after each unit (each tensor once per cut); with
    ``local`` ((node, output) -> bytes per device), those bytes instead of the whole tensor's."""
    unit_of = {}
    for k, (a, b) in enumerate(spans):
        for i in range(a, b):
            unit_of[graph.nodes[i].name] = k
    last: dict[tuple[str, int], tuple[int, int]] = {}  # tensor -> (producer unit, last consumer unit)
    for node in graph.nodes:
        for op in node.inputs:
            if op.is_node:
                key = (op.source, op.output)
                prod, far = last.get(key, (unit_of[op.source], unit_of[op.source]))
                last[key] = (prod, max(far, unit_of[node.name]))
    diff = np.zeros(len(spans) + 1)
    for (src, out), (a, b) in last.items():
        if b > a:
            nbytes = graph.node(src).outputs[out].nbytes if local is None else local[(src, out)]
            diff[a] += nbytes
            diff[b] -= nbytes
    return np.cumsum(diff)[: len(spans) - 1]
