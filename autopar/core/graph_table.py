"""``print(graph)``: one row per node with its op, iteration space, FLOPs and parameters."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: ir imports this module to print a graph
    from autopar.core.ir import Graph, Node


def human(n: float) -> str:
    """1234567 -> '1.23M': short enough for a table column."""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}" if isinstance(n, float) else str(n)


def dims_text(node: Node) -> str:
    """'b=8 s=64 n=384 k~128': '~' marks a reduction dim, '!' one that cannot be split."""
    parts = []
    for d in node.dims:
        sep = "~" if d.reduction else "="
        mark = "" if d.splittable else "!"
        parts.append(f"{d.name}{sep}{d.size}{mark}")
    return " ".join(parts)


def format_graph(graph: Graph) -> str:
    rows = [("node", "op", "module", "dims (~ reduction, ! unsplittable)", "FLOPs", "params")]
    for n in graph.nodes:
        op = n.op + (" (replicated)" if n.unsupported else "")
        rows.append((n.name, op, n.module or "-", dims_text(n), human(n.flops), human(n.param_count)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    title = f"{graph.model_name or 'graph'}: {len(graph.nodes)} nodes, {len(graph.edges)} edges, "
    title += f"{human(graph.flops)} forward FLOPs, {human(graph.param_count)} parameters"
    lines.insert(0, title)
    if graph.unsupported:
        lines.append("")
        lines.append(f"replicated (no split rule): {len(graph.unsupported)} node(s)")
        for n in graph.unsupported:
            lines.append(f"  {n.name} ({n.target}): {n.unsupported}")
    return "\n".join(lines)
