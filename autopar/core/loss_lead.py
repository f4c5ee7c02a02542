"""What a mean cross-entropy's count of counted targets can overlap with.

A mean cross-entropy over class indices whose averaged items are split sums the shards' counts of
counted targets (those not ``ignore_index``) across the ranks: one all-reduce of one number
(``codegen/counted.py``). The count depends on the targets alone, so codegen issues it as soon as
they exist (usually a program input) and waits for it at the loss: the forward work that does not
lead to the targets runs while it is in flight. ``mark_count_leads`` records that work's FLOPs on
the loss node (``LEAD_FLOPS``) when a graph is traced, for ``cost_models/loss_count.py`` to price
only what the overlap leaves exposed.
"""

from __future__ import annotations

from autopar.core.ir import Graph, Node

# Node.attrs key: the forward FLOPs of the nodes before a counted loss that its targets do not
# depend on (codegen runs them while the count's all-reduce is in flight)
LEAD_FLOPS = "count_lead_flops"


def counts_targets(node: Node) -> bool:
    """A mean cross-entropy over class indices: its mean is over the counted targets."""
    return (node.op == "cross_entropy" and len(node.inputs) >= 2
            and node.inputs[1].spec.dtype.startswith(("int", "uint"))
            and node.attrs.get("reduction", "mean") == "mean")


def target_cone(graph: Graph, node: Node) -> set[str]:
    """The names of the nodes the loss's targets are computed from (the targets' producer
    included): what must run before the count can start."""
    producers = {n.name: n for n in graph.nodes}
    cone: set[str] = set()
    stack = [node.inputs[1].source]
    while stack:
        name = stack.pop()
        if name in producers and name not in cone:
            cone.add(name)
            stack.extend(op.source for op in producers[name].inputs)
    return cone


def mark_count_leads(graph: Graph) -> Graph:
    """Record ``LEAD_FLOPS`` on every counted loss of ``graph`` (in place; returns it)."""
    for i, node in enumerate(graph.nodes):
        if counts_targets(node):
            cone = target_cone(graph, node)
            lead = sum(n.flops for n in graph.nodes[:i] if n.name not in cone)
            if lead:
                node.attrs[LEAD_FLOPS] = int(lead)
            else:
                node.attrs.pop(LEAD_FLOPS, None)
    return graph
