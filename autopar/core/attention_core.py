"""The attention cores of a graph: what selective (attention-only) recomputation re-runs.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
section 4.2) recompute only each attention's core: the scores ``q @ k^T``, their scaling and
mask, the softmax, its dropout and the product with the values. Those tensors are the ones that
grow with the sequence squared (``batch x heads x seq x seq``) while their FLOPs are a small part
of the layer's, so dropping them saves most of the activation memory for little compute.

A core, found from each ``softmax`` node: the nearest matmul upstream of it (the scores), the
nearest matmul downstream (the product with the values), and every node between them in
topological order that the second one depends on (the scale, the mask, the softmax, the
dropout). A fused attention (``scaled_dot_product_attention``) has no softmax node and no core:
it already keeps no scores.
"""

from __future__ import annotations

from autopar.core.ir import Graph

MATMULS = ("matmul", "bmm", "einsum", "baddbmm")
SOFTMAX = ("softmax",)
HOPS = 4  # the most nodes between a matmul and the softmax (scale, mask, dropout, a cast)


def attention_cores(graph: Graph) -> list[list[int]]:
    """Each attention core as the indices of its nodes, in topological order."""
    pos = {n.name: i for i, n in enumerate(graph.nodes)}
    users: dict[str, list[int]] = {}
    for i, n in enumerate(graph.nodes):
        for op in n.inputs:
            if op.is_node:
                users.setdefault(op.source, []).append(i)
    cores: list[list[int]] = []
    taken: set[int] = set()
    for s, node in enumerate(graph.nodes):
        if node.op not in SOFTMAX or s in taken:
            continue
        first = _upstream_matmul(graph, pos, s)
        last = _downstream_matmul(graph, users, s)
        if first is None or last is None:
            continue
        core = _between(graph, pos, first, last)
        if s in core and not taken & set(core):
            cores.append(core)
            taken.update(core)
    return cores


def _upstream_matmul(graph: Graph, pos: dict[str, int], i: int) -> int | None:
    """The nearest matmul upstream (breadth first over every input: the mask beside the scores
    leads to none); the latest of those equally near."""
    level = {i}
    for _ in range(HOPS + 1):
        level = {pos[op.source] for j in level for op in graph.nodes[j].inputs if op.is_node and op.source in pos}
        found = [j for j in level if graph.nodes[j].op in MATMULS]
        if found:
            return max(found)
    return None


def _downstream_matmul(graph: Graph, users: dict[str, list[int]], i: int) -> int | None:
    for _ in range(HOPS + 1):
        after = users.get(graph.nodes[i].name, [])
        if len(after) != 1:
            return None
        i = after[0]
        if graph.nodes[i].op in MATMULS:
            return i
    return None


def _between(graph: Graph, pos: dict[str, int], first: int, last: int) -> list[int]:
    """Nodes from ``first`` to ``last`` that ``last`` depends on."""
    need = {last}
    for i in range(last, first - 1, -1):
        if i in need:
            need.update(pos[op.source] for op in graph.nodes[i].inputs
                        if op.is_node and op.source in pos and first <= pos[op.source] <= last)
    return sorted(need)


def attention_members(graph: Graph) -> dict[int, str]:
    """Node index -> the name of its attention core (``<module>:attention<j>``): the groups
    ``blocks.apply_training`` recomputes, and codegen wraps in ``torch.utils.checkpoint``."""
    out = {}
    for j, core in enumerate(attention_cores(graph)):
        name = f"{graph.nodes[core[0]].module}:attention{j}"
        out.update((i, name) for i in core)
    return out
