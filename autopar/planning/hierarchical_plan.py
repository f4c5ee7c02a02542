"""A priced candidate of the hierarchical search as a ``Plan``: the mesh its degrees make
(``mesh_of``), each node's config on it (``assignment_of``: the tensor group's layout, the batch
also over the data axes), each stage's compute, and the plan's strategy, notes and report."""

from __future__ import annotations

import math

import numpy as np

from autopar.core.blocks import recomputed_blocks
from autopar.core.ir import Graph
from autopar.core.sequence import sequence_dims
from autopar.core.strategy import Degrees, Strategy
from autopar.planning.every import every_of, options_of
from autopar.planning.plan import Plan, SearchInfo, Stage
from autopar.planning.step_bounds import rerun_flops
from autopar.planning.step_price import Priced, data_groups
from autopar.planning.units import UnitStats


def mesh_of(deg: Degrees) -> tuple[tuple[int, ...], tuple[int, ...], dict]:
    """Mesh axes, outer level first; per level: pipeline, data (less the expert group), the expert
    group, context, then the tensor group's prime axes. Returns (shape, level, roles) with roles:
    'pipeline'/'data'/'expert'/'context' -> axes ('data' lists the expert groups' axes too: the
    batch is cut over all of them), 'tensor' -> the full-mesh axis of each axis of the tensor
    group's own mesh (``Cluster(t, t0).mesh()``: level 1 first)."""
    from autopar.core.cluster import prime_factors

    shape, level = [], []
    roles = {"pipeline": [], "data": [], "expert": [], "context": [], "tensor_by_level": {}}
    for lvl in reversed(range(len(deg.tensor))):
        ctx = deg.context[lvl] if deg.context else 1
        ep = deg.expert[lvl] if deg.expert else 1
        # the expert group is the innermost ``ep`` of the level's data devices: its own axis, so
        # that the routed experts can be cut over it while the batch is cut over both
        for role, k in (("pipeline", deg.pipeline[lvl]), ("data", deg.data[lvl] // ep), ("expert", ep),
                        ("context", ctx)):
            if k > 1:
                roles[role].append(len(shape))
                shape.append(k)
                level.append(lvl)
        axes = []  # as the group's own mesh has them: in-node primes, one axis across nodes
        for f in (prime_factors(deg.tensor[lvl]) if lvl == 0 else [deg.tensor[lvl]] if deg.tensor[lvl] > 1 else []):
            axes.append(len(shape))
            shape.append(f)
            level.append(lvl)
        roles["tensor_by_level"][lvl] = axes
    inner = [a for lvl in (1, 0) for a in roles["tensor_by_level"].get(lvl, [])]
    roles["tensor"] = inner
    roles["data"] = sorted(roles["data"] + roles["expert"])
    return tuple(shape), tuple(level), roles


def assignment_of(pr: Priced, s: UnitStats, graph: Graph) -> dict:
    """Each node's config on the full mesh: its group config, the batch dim also over the data
    axes, the routed experts over the expert group's axes (their tokens over the rest of the data
    axes: the experts dim carries the tokens, ``core.ir.CARRIES``), and the sequence over the
    context axes (attention by its query rows, ``l``; its keys stay whole: K/V are gathered, or, with
    ``Degrees.ring``, read in their sequence chunks by codegen's ring, ``ring_attention.ring_layout``)."""
    from autopar.core.batch import batch_dims
    from autopar.core.ir import carried_dim
    from autopar.core.tables import Config

    shape, _, roles = mesh_of(pr.candidate.degrees)
    tmap = roles["tensor"]
    batch = batch_dims(graph)
    seq = sequence_dims(graph) if roles["context"] else {}
    out: dict = {}
    cut: dict = {}  # (node, output) -> per axis, the mesh axes that cut it (context plans only)
    for i, node in enumerate(graph.nodes):
        w = s.node_map[i] if s.node_map is not None else i
        c = s.tables.configs[w][s.choice[w]]
        names = [dim.name for dim in node.dims]
        axes = [tuple(tmap[a] for a in ax) for ax in (c.mesh_axes or ((),) * len(c.splits))]
        extra: dict[str, tuple[int, ...]] = {}
        experts = next((e for e in names if carried_dim(node, e) is not None), None)
        if experts is not None and roles["expert"]:
            extra[experts] = tuple(roles["expert"])
            extra[carried_dim(node, experts)] = tuple(a for a in roles["data"] if a not in roles["expert"])
        elif batch.get(node.name) is not None:
            extra[batch[node.name]] = tuple(roles["data"])
        c_ = math.prod(shape[a] for a in roles["context"])
        s_dim = _context_dim(node, seq.get(node.name, ()), c_) or _merged_context_dim(node, extra, cut, roles, shape)
        if s_dim is not None:
            extra[s_dim] = extra.get(s_dim, ()) + tuple(roles["context"])
        splits = list(c.splits)
        for name, more in extra.items():
            k = names.index(name)
            axes[k] = tuple(more) + axes[k]
            splits[k] *= math.prod(shape[a] for a in more)
        out[node.name] = Config(tuple(splits), tuple(axes))
        if roles["context"]:
            by_dim = dict(zip(names, axes))
            for j, spec in enumerate(node.outputs):
                cut[(node.name, j)] = [tuple(a for d in ax for a in by_dim.get(d, ())) for ax in spec.axes]
    return out


def _merged_context_dim(node, extra: dict, cut: dict, roles: dict, shape) -> str | None:
    """A batch dim that reads an axis its producer cut over the data then the context axes (the
    batch and the sequence flattened into one axis, as a loss reads its logits): cut it over both,
    so the flattened rows stay where they are."""
    for name, axes in extra.items():
        want = tuple(axes) + tuple(roles["context"])
        for op in node.inputs:
            have = cut.get((op.source, op.output))
            for i, ax in enumerate(op.spec.axes):
                if have and ax[:1] == (name,) and i < len(have) and have[i] == want:
                    size = node.dim(name).size
                    return name if size % math.prod(shape[a] for a in want) == 0 else None
    return None


def _context_dim(node, dims, c: int) -> str | None:
    """The dim of ``node`` a context split cuts: its first sequence dim (attention: the query
    rows ``l``, never the keys ``m``), None where it has none or the split would not be even."""
    if c <= 1:
        return None
    for d in node.dims:
        if d.name in dims and d.splittable and not (node.op == "sdpa" and d.name == "m"):
            return d.name if d.size % c == 0 else None
    return None


def stage_compute(pr: Priced, s: UnitStats, search, a: int, b: int) -> float:
    """Seconds of compute per step on one device of the stage of units [a, b): its microbatches'
    forward and backward (``s.compute`` is per microbatch) and its optimizer update, priced as
    ``step_price.price`` prices the step's compute and optimizer terms."""
    from autopar.cost_models.memory import optimizer_states
    from autopar.cost_models.training import optimizer_step_time
    from autopar.planning.step_price import zero_factors

    c = pr.candidate
    g, _, _, _ = data_groups(c.degrees, c.zero_inner)
    fo = zero_factors(c.zero, g)[2]
    update = optimizer_step_time(float(np.sum(s.numel[a:b])) / fo, search.itemsize, optimizer_states(search.optimizer),
                                 search.master, search.cluster.memory_bandwidth,
                                 foreach=search.cluster.foreach_update)
    return c.microbatches * float(np.sum(s.compute[a:b])) + float(update)


def to_plan(pr: Priced, search, common: dict, info: SearchInfo, baselines: dict,
            reference: dict | None = None) -> Plan:
    from autopar.core.tables import Mesh

    c = pr.candidate
    s = search.stats(c)
    deg = c.degrees
    shape, level, roles = mesh_of(deg)
    names = [n.name for n in search.graph.nodes]
    spans = search.spans
    stages = []
    for k, (a, b) in enumerate(pr.solution.stages):  # interleaved: rank k % p runs stage k
        lo, hi = spans[a][0], spans[b - 1][1]
        r = k % deg.p
        stages.append(Stage(names[lo:hi], search.cluster.devices // deg.p, pr.solution.stage_time[r],
                            pr.solution.sync[r] if pr.solution.sync else 0.0,
                            (pr.solution.peaks or pr.solution.memory)[r],
                            stage_compute(pr, s, search, a, b)))
    g, _, _, _ = data_groups(deg, c.zero_inner)
    data_levels = [level[a] for a in roles["data"]]
    zero_axes = tuple(a for a, lvl in zip(roles["data"], data_levels)
                      if not c.zero_inner or lvl < max(data_levels)) if c.zero else ()
    every = every_of(c.recompute)  # every k-th block: as the flat path records it (planning/every.py)
    options = options_of(c.recompute, zero=c.zero, precision=search.precision,
                         accumulate=c.microbatches if search.accumulate and deg.p == 1 else 1)
    hw = search.totals.train_flops + rerun_flops(c, search.totals)
    strategy = Strategy(options=options, zero_axes=zero_axes,
                        recompute=(recomputed_blocks(search.graph, options) if every else
                                   tuple(b.path for b in search.blocks) if c.recompute else ()),
                        degrees=deg, microbatch_size=search.batch // (deg.d * c.microbatches),
                        time_terms=dict(pr.terms), memory_terms=dict(pr.memory_terms),
                        model_flops=search.totals.train_flops, hardware_flops=hw,
                        peak_flops=search.peak, reference=dict(reference or {}),
                        notes=[pr.bottleneck, f"ZeRO group: {g} device(s)" if c.zero else "no ZeRO",
                               *([f"pipeline schedule {c.schedule} ({c.virtual} stage(s) per rank)"]
                                 if deg.p > 1 else []),
                               "tensor-group layouts minimise time (memory checked on the result)"
                               + ("; sequence parallel: saved activations at 1/t, gathered again in the backward"
                                  if pr.sequence_parallel else ""),
                               "data-parallel sync and ZeRO gathers under compute where they fit "
                               "(at least the last bucket waited for)"]
                        + ([f"context parallelism over {deg.c} ranks priced (causal work balanced; its K/V gathers, "
                            "exposed, are in the tensor-parallel communication term); the per-node layouts cut each "
                            "node's sequence dim over the context axes (attention by its query rows, keys and "
                            "values gathered)"] if deg.c > 1 and not deg.ring else [])
                        + ([f"context parallelism over {deg.c} ranks as ring attention (seq/{deg.c} ring: causal "
                            "work balanced; each rank's K/V chunk passed on in c - 1 hops under the attention "
                            "blocks, what they take beyond them in the tensor-parallel communication term; only "
                            "the local chunk saved); the per-node layouts cut each node's sequence dim over the "
                            "context axes"] if deg.ring else [])
                        + ([f"expert parallelism over {deg.ep} devices: uniform routing assumed (each expert "
                            "receives tokens x top-k / experts; no load imbalance), token all-to-alls not "
                            "overlapped with compute"] if deg.ep > 1 else []))
    common = dict(common, mesh=Mesh(shape, level))
    return Plan(**common, assignment=assignment_of(pr, s, search.graph), cost=pr.cost, units="s",
                memory_per_device=pr.memory, search=info, stages=stages if deg.p > 1 else [],
                microbatches=c.microbatches, schedule=c.schedule if deg.p > 1 else "",
                baselines=baselines, batch=search.batch, strategy=strategy, graph=search.graph, tables=None)
