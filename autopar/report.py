"""``plan.report()``: what autopar chose, why, what it costs, and what it gains over hand plans.

One row per node, grouped by module path; a run of identical repeated blocks ("blocks.0" ...
"blocks.47" with the same configs and costs) prints once with "blocks.1-47: same as blocks.0".
Costs per node are read back from the cost tables the search used (node cost + the resharding of
its inputs), so the rows add up to the plan's total.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from autopar.graph_table import human

_BLOCK = re.compile(r"^(?P<prefix>.*?)\.(?P<idx>\d+)(?:\.(?P<rest>.*))?$")


def split_words(node, config) -> str:
    """'b/4, n/2' from a config; 'replicated' when nothing is split."""
    words = [f"{d.name}/{s}" for d, s in zip(node.dims, config.splits) if s > 1]
    return ", ".join(words) if words else "replicated"


def fmt_seconds(s: float) -> str:
    if s == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s:.3g} s"


def fmt_bytes(b: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(b) >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


@dataclass
class Row:
    module: str
    block: tuple[str, int] | None  # (prefix, index) of a repeated block, else None
    cells: list[str]


def _node_rows(plan) -> list[Row]:
    from autopar.layout import format_layout, node_layouts, to_mesh

    tables, graph = plan.tables, plan.graph
    index = {name: i for i, name in enumerate(tables.nodes)}
    choice = [tables.configs[i].index(plan.assignment[name]) for i, name in enumerate(tables.nodes)]
    incoming = np.zeros(len(tables.nodes))
    for (u, v), m in tables.edge_cost.items():
        incoming[v] += float(m[choice[u], choice[v]])
    model = _analytic_model(plan)
    rows = []
    for node in graph.nodes:
        i = index[node.name]
        cfg = plan.assignment[node.name]
        compute = comm = float(tables.node_cost[i][choice[i]])
        if model is not None:
            from autopar.cluster import Cluster

            nc = model.node_breakdown(node, cfg, Cluster(**plan.cluster), plan.mode, text=False)
            compute = sum(t.seconds for t in nc.terms if "compute" in t.label or "memory" in t.label)
            comm = float(tables.node_cost[i][choice[i]]) - compute
        mcfg = to_mesh(cfg, plan.mesh)
        params = outs = "-"
        if mcfg is not None:
            lay = node_layouts(node, mcfg, plan.mesh)
            params = " ".join(format_layout(p) for p in lay.params) or "-"
            outs = " ".join(format_layout(o) for o in lay.outputs) or "-"
        mem = float(tables.memory[i][choice[i]]) if tables.memory else 0.0
        m = _BLOCK.match(node.module or "")
        block = (m["prefix"], int(m["idx"])) if m else None
        label = node.module or node.name
        op = node.op + ("*" if node.unsupported else "")
        rows.append(Row(label, block, [label, op, split_words(node, cfg), params, outs, fmt_seconds(compute),
                                       fmt_seconds(comm + incoming[i]), fmt_bytes(mem)]))
    return rows


def _analytic_model(plan):
    if plan.cost_model != "analytic":
        return None
    from autopar.cost_models.analytic import AnalyticModel

    return AnalyticModel()


def _fold(rows: list[Row]) -> list[list[str]]:
    """Rows with runs of identical repeated blocks folded into one line."""
    out: list[list[str]] = []
    i = 0
    while i < len(rows):
        r = rows[i]
        if r.block is None:
            out.append(r.cells)
            i += 1
            continue
        prefix, first = r.block
        j = i
        while j < len(rows) and rows[j].block == (prefix, first):
            j += 1
        body = rows[i:j]
        key = [_unindexed(x) for x in body]
        k, last = j, first
        while True:
            nxt = k + len(body)
            cand = rows[k:nxt]
            if len(cand) == len(body) and all(c.block == (prefix, last + 1) for c in cand) \
                    and [_unindexed(x) for x in cand] == key:
                k, last = nxt, last + 1
            else:
                break
        out.extend(x.cells for x in body)
        if last > first:
            span = f"{first + 1}" if last == first + 1 else f"{first + 1}-{last}"
            out.append([f"{prefix}.{span}: same as {prefix}.{first}", "", "", "", "", "", "", ""])
        i = k
    return out


def _unindexed(row: Row) -> list[str]:
    m = _BLOCK.match(row.module)
    rest = m["rest"] if m else row.module
    return [rest or ""] + row.cells[1:]


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(r[c]) for r in [header] + [r for r in rows if r[1] or c == 0]) for c in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    for r in rows:
        if not r[1]:  # a fold line spans the table
            lines.append("  " + r[0])
        else:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return lines


def format_report(plan, explain: bool = False) -> str:
    c = plan.cluster
    units = fmt_seconds if plan.units == "s" else (lambda v: f"{v:.6g} {plan.units}")
    lines = [
        f"autopar plan for {plan.model_name} on {c.get('name', '?')}: {plan.devices} devices, mesh {plan.mesh.shape}"
        f" (levels {plan.mesh.level}); cost model {plan.cost_model}, space {plan.space}, mode {plan.mode}",
        f"search: {plan.search.name} in {plan.search.seconds:.3g} s, "
        + ("proven optimal under the cost model" if plan.search.gap == 0 else f"optimality gap {plan.search.gap:.3%}"),
        f"predicted step time: {units(plan.cost)}; memory per device: {fmt_bytes(plan.memory_per_device)}"
        + (f" of {fmt_bytes(c['memory_capacity'])}" if c.get("memory_capacity") else ""),
    ]
    for name, b in plan.baselines.items():
        lines.append(f"  vs {name.replace('_', ' ')}: {units(b.cost)}, {fmt_bytes(b.memory_per_device)}/device"
                     f" -> autopar is {b.cost / plan.cost:.3g}x faster")
    if plan.stages:
        lines.append(f"pipeline: {len(plan.stages)} stages x {plan.stages[0].devices} devices, "
                     f"{plan.microbatches} microbatches, {plan.schedule}")
        for k, s in enumerate(plan.stages):
            lines.append(f"  stage {k}: {s.nodes[0]} .. {s.nodes[-1]} ({len(s.nodes)} nodes), {units(s.cost)}")
    lines.append("")
    if plan.cost_model == "pase" or plan.graph is None or not hasattr(plan.graph, "nodes") \
            or not plan.tables or plan.tables.nodes != [n.name for n in getattr(plan.graph, "nodes", [])]:
        lines += _generic_rows(plan)
    else:
        header = ["module", "op", "split", "param placements", "output placements", "compute", "comm", "memory"]
        lines += _table(_fold(_node_rows(plan)), header)
        lines.append("placements per mesh axis: S(i) shard tensor axis i, R replicate, P partial sum;"
                     " comm includes resharding the node's inputs")
    if plan.unsupported:
        lines.append("")
        lines.append(f"replicated (* above; no split rule): {len(plan.unsupported)} node(s)")
        for n, why in plan.unsupported.items():
            lines.append(f"  {n}: {why}")
    if explain and plan.cost_model == "analytic" and plan.graph is not None:
        from autopar.cluster import Cluster
        from autopar.cost_models.analytic import explain_plan

        lines.append("")
        lines.append("the arithmetic (every term of the predicted step time):")
        lines += explain_plan(plan.graph, plan.assignment, Cluster(**plan.cluster), mode=plan.mode)
    return "\n".join(lines)


def _generic_rows(plan) -> list[str]:
    """For plans whose graph is not an ir.Graph (PaSE's view): node, config, node cost."""
    t = plan.tables
    rows = []
    for i, name in enumerate(t.nodes if t else plan.assignment):
        cfg = plan.assignment[name]
        cost = ""
        if t is not None:
            cost = f"{float(t.node_cost[i][t.configs[i].index(cfg)]):.6g}"
        rows.append([str(name), str(cfg.splits), cost])
    widths = [max(len(r[k]) for r in rows + [["node", "config", "node cost"]]) for k in range(3)]
    out = ["  ".join(h.ljust(w) for h, w in zip(["node", "config", "node cost"], widths))]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return out
