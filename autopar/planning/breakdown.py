"""The plan's rows, made when the plan is made: per node and per stage, from the same tables and
cost model the search used, so they add up to the plan's cost and the report needs nothing else.

A node's ``compute`` is its table cost less its non-compute terms (gradient sync, batch-norm
statistics) and any graph-output reduction; ``comm`` is those plus the resharding of its inputs
(the edges into it). In a pipelined plan the gradient sync is paid once per step, so it is kept
apart (``NodeRow.sync``) and a stage's rows are per microbatch, on the stage's devices.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from autopar.core.batch import batch_dims
from autopar.core.sequence import balanced_causal, sequence_dims
from autopar.core.ir import Graph, Node
from autopar.core.layout import format_layout, node_layouts, to_mesh
from autopar.core.tables import Config, CostTables
from autopar.cost_models.tables import signature
from autopar.planning.rows import CostTerm, NodeRow, StageRow

_NOT_COMM = ("compute", "optimizer", "infeasible")


def split_words(node: Node, config: Config, seq: set[str] = frozenset(), gathered: bool = False) -> str:
    """'b/4, n/2' from a config; 'replicated' when nothing is split. A dim along the sequence
    (``seq``: ``core.sequence``) reads 'seq/4'; an attention's query rows 'seq/4 all-gather K/V'
    where its keys and values arrive split along the sequence (``gathered``: the reshard into it
    all-gathers them, and reduce-scatters their gradients), 'seq/4 K/V whole' where they do not;
    ', balanced' where a causal attention's rows are exchanged for even work (``balanced_causal``)."""
    words = []
    for d, s in zip(node.dims, config.splits):
        if s == 1:
            continue
        if node.op == "sdpa" and d.name == "l":
            words.append(f"seq/{s} " + ("all-gather K/V" if gathered else "K/V whole")
                         + (", balanced" if balanced_causal(node, s) else ""))
        else:
            words.append(f"seq/{s}" if d.name in seq else f"{d.name}/{s}")
    return ", ".join(words) if words else "replicated"


def keys_arrive_split(graph: Graph, node: Node, assignment: dict[str, Config]) -> bool:
    """Does an sdpa node's key (or value) come from a node that splits the dim indexing the key
    positions? Then running the query rows split all-gathers them."""
    for op in node.inputs[1:3]:
        axis = next((i for i, dims in enumerate(op.spec.axes) if "m" in dims), None)
        cfg = assignment.get(op.source)
        if axis is None or cfg is None or op.source.startswith(("input:", "param:")):
            continue
        src = graph.node(op.source)
        out_axes = src.outputs[op.output].axes
        if axis < len(out_axes) and any(s > 1 for d, s in zip(src.dims, cfg.splits) if d.name in out_axes[axis]):
            return True
    return False


def split_kind(node: Node, config: Config, batch_dim: str | None, seq: set[str] = frozenset()) -> str:
    split = [d for d, s in zip(node.dims, config.splits) if s > 1]
    if not split:
        return "replicated"
    kinds = {"reduction" if d.reduction else "data" if d.name == batch_dim else "sequence" if d.name in seq
             else "tensor" for d in split}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def choice_of(tables: CostTables, assignment: dict[str, Config]) -> list[int]:
    return [tables.configs[i].index(assignment[name]) for i, name in enumerate(tables.nodes)]


def incoming(tables: CostTables, choice: list[int]) -> np.ndarray:
    """Per node: the resharding of its inputs (the edge costs into it) under ``choice``."""
    out = np.zeros(len(tables.nodes))
    for (u, v), m in tables.edge_cost.items():
        out[v] += float(m[choice[u], choice[v]])
    return out


def mesh_rows(graph: Graph, tables: CostTables, assignment: dict[str, Config], model, cluster, mode: str,
              sync_apart: bool = False, memory: list[float] | None = None) -> list[NodeRow]:
    """One row per node of a mesh plan (analytic or profiled), priced by ``model`` on ``cluster``.

    ``sync_apart``: keep the gradient sync and the optimizer update out of ``comm`` and
    ``compute`` (a pipeline stage pays them once per step). ``memory``: bytes per device per node, when not the tables' (a stage's in-flight)."""
    mesh = cluster.mesh()
    choice = choice_of(tables, assignment)
    into = incoming(tables, choice)
    batch = batch_dims(graph)
    seq = sequence_dims(graph)
    outputs: dict[str, list[int]] = {}
    for name, idx in graph.outputs:
        outputs.setdefault(name, []).append(idx)
    sig_of = getattr(model, "signature", signature)
    cache: dict[tuple, tuple[list[CostTerm], str, str]] = {}
    rows = []
    for i, node in enumerate(graph.nodes):
        cfg = assignment[node.name]
        key = (sig_of(node), cfg)
        if key not in cache:
            nc = model.node_breakdown(node, cfg, cluster, mode, text=False)
            terms = [CostTerm(t.kind, t.label, t.seconds) for t in nc.terms]
            params = outs = "-"
            mcfg = to_mesh(cfg, mesh)
            if mcfg is not None:
                lay = node_layouts(node, mcfg, mesh)
                params = " ".join(format_layout(p) for p in lay.params) or "-"
                outs = " ".join(format_layout(o) for o in lay.outputs) or "-"
            cache[key] = (terms, params, outs)
        terms, params, outs = cache[key]
        terms = list(terms)
        red = sum(float(model.output_cost(node, k, [cfg], cluster, mode)[0]) for k in outputs.get(node.name, []))
        if red:
            terms.append(CostTerm("output", "graph output partial -> all-reduce", red))
        if into[i]:
            terms.append(CostTerm("reshard", "resharding the node's inputs (forward and backward)", float(into[i])))
        cost = float(tables.node_cost[i][choice[i]])
        once = ("sync", "optimizer") if sync_apart else ("sync",)  # paid once per step in a pipeline
        sync = sum(t.seconds for t in terms if t.kind in once)
        other = sum(t.seconds for t in terms if t.kind not in _NOT_COMM + ("sync", "reshard", "output"))
        compute = cost - sync - other - red if math.isfinite(cost) else cost
        mem = memory[i] if memory is not None else (
            float(tables.memory[i][choice[i]]) if tables.memory else None)
        rows.append(NodeRow(
            name=node.name, module=node.module or node.name, op=node.op,
            split=split_words(node, cfg, seq[node.name],
                              node.op == "sdpa" and keys_arrive_split(graph, node, assignment)),
            split_kind=split_kind(node, cfg, batch.get(node.name), seq[node.name]), params=params, outputs=outs,
            compute=compute, comm=other + red + float(into[i]) + (0.0 if sync_apart else sync),
            memory=mem, sync=sync if sync_apart else 0.0, replicated_why=node.unsupported or "",
            terms=terms))
    return rows


def stage_rows(option, solution, model, sub_cluster, mode: str) -> list[StageRow]:
    """The chosen pipeline's stages, from the option the stage search picked (``stages.py``):
    its microbatch graph, stage-mesh tables and per-node times, not re-priced."""
    from autopar.search.pipeline import in_flight

    g, t, costs = option.graph, option.tables, option.costs
    local = {name: t.configs[i][option.choice[i]] for i, name in enumerate(t.nodes)}
    static, acts = costs.static_memory, costs.activation_memory
    cut = np.concatenate([[0.0], costs.cut_time, [0.0]])
    n_stages = len(solution.stages)
    out = []
    for k, (a, b) in enumerate(solution.stages):
        held = in_flight(solution.schedule, k, n_stages, solution.microbatches)
        memory = [float(static[j] + held * acts[j]) for j in range(len(g.nodes))]
        rows = mesh_rows(g, t, local, model, sub_cluster, mode, sync_apart=True, memory=memory)[a:b]
        if option.accumulate is not None:  # each microbatch's gradients added into the held ones: the node's work
            rows = [dataclasses.replace(r, compute=r.compute + float(option.accumulate[a + i])) for i, r in enumerate(rows)]
        per = solution.devices
        out.append(StageRow(
            index=k, first=a, last=b - 1, devices=(k * per, (k + 1) * per), time=solution.stage_time[k],
            compute=math.fsum(r.compute for r in rows), comm=math.fsum(r.comm for r in rows),
            send_recv=float(cut[a] + cut[b]), sync=math.fsum(r.sync for r in rows),
            memory=solution.memory[k], in_flight=held, nodes=rows))
    return out


def pase_rows(pgraph, tables: CostTables, assignment: dict[str, Config]) -> list[NodeRow]:
    """Per PaSE node: its layer cost at r = 0 (FLOPs) as compute, the rest of its layer cost plus
    the edges into it (words moved x r) as comm, in PaSE's FLOP-equivalent units."""
    from autopar.pase.names import pase_dim_names, pase_split_kind, pase_split_words
    from autopar.pase.ops import layer_cost

    choice = choice_of(tables, assignment)
    into = incoming(tables, choice)
    rows = []
    for i, node in enumerate(pgraph.nodes):
        name = tables.nodes[i]
        cfg = assignment[name]
        cost = float(tables.node_cost[i][choice[i]])
        flops = float(layer_cost(node, np.array([cfg.splits], dtype=np.float64), 0.0)[0])
        src = "+".join(node.sources) if node.sources else "-"
        rows.append(NodeRow(
            name=name, module=name, op=node.op, split=pase_split_words(node, cfg),
            split_kind=pase_split_kind(node, cfg), compute=flops, comm=cost - flops + float(into[i]),
            sources=src if len(src) <= 40 else src[:37] + "...",
            space=" ".join(f"{d}={n}" for d, n in zip(pase_dim_names(node), node.domain))))
    return rows


def pase_rate(pgraph, tables: CostTables) -> float | None:
    """The word-to-FLOP rate ``r`` the tables were made with (None if no node moves words)."""
    from autopar.pase.ops import layer_cost

    for i, node in enumerate(pgraph.nodes):
        for k, c in enumerate(tables.configs[i]):
            row = np.array([c.splits], dtype=np.float64)
            f0, f1 = float(layer_cost(node, row, 0.0)[0]), float(layer_cost(node, row, 1.0)[0])
            if f1 - f0 > 0:
                return (float(tables.node_cost[i][k]) - f0) / (f1 - f0)
    return None
