"""A picture of a plan: one bar per node in execution order, compute and communication stacked,
coloured by the kind of split the node got. Rendered with matplotlib's Agg backend (no display).

For a deep model that is more readable than a drawn DAG: the repeated blocks show up as a
repeating pattern, and where the time goes (compute vs communication) is visible at a glance.
"""

from __future__ import annotations

from pathlib import Path

KINDS = {
    "replicated": "#b0b0b0",
    "data": "#4c72b0",
    "tensor": "#dd8452",
    "reduction": "#c44e52",
    "mixed": "#8172b3",
}


def split_kind(node, config, batch_dim: str | None) -> str:
    split = [d for d, s in zip(node.dims, config.splits) if s > 1]
    if not split:
        return "replicated"
    kinds = {"reduction" if d.reduction else "data" if d.name == batch_dim else "tensor" for d in split}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def draw(plan, path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from autopar.batch import batch_dims

    graph, t = plan.graph, plan.tables
    batch = batch_dims(graph)
    choice = [t.configs[i].index(plan.assignment[n]) for i, n in enumerate(t.nodes)]
    incoming = [0.0] * len(t.nodes)
    for (u, v), m in t.edge_cost.items():
        incoming[v] += float(m[choice[u], choice[v]])
    cost = [float(t.node_cost[i][choice[i]]) for i in range(len(t.nodes))]
    colors = [KINDS[split_kind(n, plan.assignment[n.name], batch[n.name])] for n in graph.nodes]
    x = range(len(t.nodes))
    fig, ax = plt.subplots(figsize=(min(4 + 0.08 * len(x), 40), 4.5))
    ax.bar(x, cost, color=colors, width=1.0, linewidth=0)
    ax.bar(x, incoming, bottom=cost, color="black", alpha=0.35, width=1.0, linewidth=0)
    ax.set_xlabel("node (execution order)")
    ax.set_ylabel(f"predicted time per step ({plan.units})")
    ax.set_title(f"{plan.model_name} on {plan.cluster.get('name', '?')}: {plan.cost:.4g} {plan.units} "
                 f"({plan.baselines['data_parallel'].cost / plan.cost:.2f}x over data parallel)"
                 if "data_parallel" in plan.baselines else f"{plan.model_name}: {plan.cost:.4g} {plan.units}")
    handles = [Patch(color=c, label=k) for k, c in KINDS.items()]
    handles.append(Patch(color="black", alpha=0.35, label="resharding inputs"))
    ax.legend(handles=handles, loc="upper right", fontsize=8, ncol=3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    return path
