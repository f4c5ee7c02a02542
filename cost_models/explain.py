"""A whole plan's predicted step time, term by term (``Plan.explanation``): every node's terms,
every edge's reshards, every partial graph output, and their sum, as a reader checks them by hand."""

from __future__ import annotations

from autopar.cost_models.analytic import AnalyticModel, check_mode

from autopar.core.cluster import Cluster
from autopar.core.tables import Config


def explain_plan(graph, choice: dict[str, Config], cluster: Cluster,
                 model: AnalyticModel | None = None, mode: str = "train") -> list[str]:
    """The predicted step time of a whole plan, term by term: nodes, edges, outputs, the sum."""
    model = model or AnalyticModel()
    lines = [cluster.describe(), f"mode: {check_mode(mode)}; model: {model}"]
    total = 0.0
    for n in graph.nodes:
        lines += model.explain(n, choice[n.name], cluster, mode)
        total += model.node_breakdown(n, choice[n.name], cluster, mode, text=False).seconds
    for e in graph.edges:
        src, dst = graph.node(e.src), graph.node(e.dst)
        ls, t = model.explain_edge(src, e.src_output, dst, e.dst_input, choice[e.src],
                                   choice[e.dst], cluster, mode)
        lines += ls
        total += t
    for name, idx in graph.outputs:
        if name in {n.name for n in graph.nodes}:
            t = float(model.output_cost(graph.node(name), idx, [choice[name]], cluster, mode)[0])
            if t:
                lines.append(f"output {name}:{idx} partial -> all-reduce = {t:.4g} s")
                total += t
    lines.append(f"predicted step time = {total:.6g} s")
    return lines
