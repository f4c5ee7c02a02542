"""A window over a graph whose repeated blocks come in runs of different kinds.

``blocks.block_window`` stands a deep graph by a few blocks when every block is the same.
Models mix kinds: DeepSeek-V3 has 3 dense layers and then 58 MoE layers, Llama 4 alternates.
``run_window`` cuts the blocks into runs of consecutive identical blocks and keeps, per run, its
first block, one middle block and its last block (a run of at most ``k`` blocks is kept whole),
so the window is prologue, ``k`` blocks per run, epilogue: each run's repeated middle solved once,
the joins between runs (a dense layer's output flowing into the first MoE layer) kept as they are.
"""

from __future__ import annotations

import dataclasses

from autopar.core.blocks import Window, repeated_blocks, units, window_of
from autopar.core.ir import Graph, Node, Operand


def _signature(node: Node) -> tuple:
    """What makes two nodes price alike (as ``blocks.block_window`` compares them)."""
    return (node.op, node.dims, tuple(o.spec for o in node.inputs), tuple(o.spec for o in node.params),
            node.outputs, node.flops, repr(sorted(node.attrs.items(), key=str)))


def _runs(graph: Graph, block_units: list[tuple[int, int]]) -> list[list[int]]:
    """Indices into ``block_units`` grouped into runs of consecutive identical blocks."""
    runs: list[list[int]] = []
    ref = None
    for j, (a, b) in enumerate(block_units):
        shape = [_signature(graph.nodes[i]) for i in range(a, b)]
        if runs and shape == ref:
            runs[-1].append(j)
        else:
            runs.append([j])
            ref = shape
    return runs


def run_window(graph: Graph, k: int = 3) -> Window | None:
    """The window, or None when no run has more than ``k`` blocks (nothing to save)."""
    blocks = repeated_blocks(graph)
    spans = units(graph, blocks)
    if not blocks:
        return None
    first = 1 if blocks[0].nodes[0] > 0 else 0
    block_units = spans[first:first + len(blocks)]
    runs = _runs(graph, block_units)
    if all(len(r) <= k for r in runs):
        return None
    stands: dict[int, int] = {}  # block -> the kept block of its run that stands for it
    for run in runs:
        n = len(run)
        for pos, j in enumerate(run):
            stands[j] = j if n <= k else run[0 if pos == 0 else k - 1 if pos == n - 1 else min(pos, k - 2)]
    kept = sorted(set(stands.values()))
    rename: dict[str, str] = {}
    for run in runs:  # a dropped block's node -> the same node of its run's last kept block
        if len(run) <= k:
            continue
        last = block_units[run[k - 1]][0]
        for j in run[k:]:
            a, b = block_units[j]
            for off in range(b - a):
                rename[graph.nodes[a + off].name] = graph.nodes[last + off].name
    keep = list(range(0, block_units[0][0]))
    for j in kept:
        keep.extend(range(*block_units[j]))
    keep.extend(range(block_units[-1][1], len(graph.nodes)))
    nodes = []
    for i in keep:
        n = graph.nodes[i]
        ins = tuple(Operand(rename.get(o.source, o.source), o.output, o.spec) for o in n.inputs)
        nodes.append(dataclasses.replace(n, inputs=ins))
    outputs = [(rename.get(s, s), i) for s, i in graph.outputs]
    wg = Graph(nodes, dict(graph.inputs), outputs, graph.model_name, None)
    wspans = units(wg)
    window_unit = {j: first + kept.index(j) for j in kept}
    return window_of(wg, spans, wspans, first, len(blocks), lambda j: window_unit[stands[j]])
