"""Repeated blocks of a graph, and the graph as training sees it under a ``TrainingOptions``.

A *block* is the run of nodes of one entry of a ``ModuleList`` / ``Sequential`` (module path
``blocks.3...``): the unit large trainings recompute (``torch.utils.checkpoint`` per layer), cut
into pipeline stages and shard with FSDP. ``units`` cuts the node sequence at the blocks' first
nodes: the prologue (embeddings), one unit per block, the epilogue (head, loss).

``apply_training`` returns the graph the cost and memory models should price: floating-point
tensors in the compute dtype (mixed precision keeps activations, parameters and gradients in
bf16/fp16, as Megatron-LM and autocast-with-bf16-parameters do; norms and softmax included, a
stated simplification) and every node's ``NodeTraining`` record in ``attrs["train"]``.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass

from autopar.core.ir import Graph, Node, Operand, TensorSpec
from autopar.core.attention_core import attention_members
from autopar.core.selective import keeps_output
from autopar.core.strategy import RECOMPUTE_ATTENTION, RECOMPUTE_POINTWISE, NodeTraining, TrainingOptions
from autopar.core.weight_views import WEIGHT_VIEW

_NUMBERED = re.compile(r"^((?:[^.]+\.)*?\d+)(?:\.|$)")  # up to the first numbered path component


@dataclass(frozen=True)
class Block:
    path: str  # "blocks.3"
    nodes: tuple[int, ...]  # positions in graph.nodes


def block_path(module: str) -> str | None:
    m = _NUMBERED.match(module or "")
    return m.group(1) if m else None


def _parent(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ""


def repeated_blocks(graph: Graph) -> list[Block]:
    """Blocks in order of their first node; only containers with at least two entries count."""
    members: dict[str, list[int]] = {}
    for i, n in enumerate(graph.nodes):
        p = block_path(n.module)
        if p is not None:
            members.setdefault(p, []).append(i)
    per_parent = Counter(_parent(p) for p in members)
    out = [Block(p, tuple(ix)) for p, ix in members.items() if per_parent[_parent(p)] >= 2]
    return sorted(out, key=lambda b: b.nodes[0])


def units(graph: Graph, blocks: list[Block] | None = None) -> list[tuple[int, int]]:
    """[start, end) node ranges: prologue, one per block (up to the next block's start), epilogue.

    Without repeated blocks every node is its own unit."""
    blocks = repeated_blocks(graph) if blocks is None else blocks
    n = len(graph.nodes)
    if not blocks:
        return [(i, i + 1) for i in range(n)]
    starts = [b.nodes[0] for b in blocks]
    last_end = max(blocks[-1].nodes) + 1
    out = []
    if starts[0] > 0:
        out.append((0, starts[0]))
    for a, b in zip(starts, starts[1:] + [last_end]):
        out.append((a, b))
    if last_end < n:
        out.append((last_end, n))
    return out


def _cast_spec(spec: TensorSpec, dtype: str) -> TensorSpec:
    return dataclasses.replace(spec, dtype=dtype) if spec.dtype == "float32" else spec


def _cast_node(node: Node, dtype: str) -> Node:
    inputs = tuple(Operand(o.source, o.output, _cast_spec(o.spec, dtype)) for o in node.inputs)
    params = tuple(Operand(o.source, o.output, _cast_spec(o.spec, dtype)) for o in node.params)
    outputs = tuple(_cast_spec(s, dtype) for s in node.outputs)

    def ratio(old, new) -> float:
        a = sum(s.nbytes for s in old)
        return sum(s.nbytes for s in new) / a if a else 1.0

    read = ratio([o.spec for o in node.inputs + node.params], [o.spec for o in inputs + params])
    written = ratio(node.outputs, outputs)
    return dataclasses.replace(node, inputs=inputs, params=params, outputs=outputs,
                               bytes_read=int(node.bytes_read * read),
                               bytes_written=int(node.bytes_written * written))


def recomputed_blocks(graph: Graph, options: TrainingOptions) -> tuple[str, ...]:
    """The block paths ``options`` recomputes: none, every repeated block, or every k-th (blocks
    0, k, 2k, ...: the memory of the others kept, 1/k of the recomputed forward paid); pointwise
    recomputation: every repeated block (its matmuls' outputs kept, ``core/selective.py``)."""
    if not options.recompute or options.recompute == RECOMPUTE_ATTENTION:
        return ()
    return tuple(b.path for i, b in enumerate(repeated_blocks(graph)) if i % options.every == 0)


def apply_training(graph: Graph, options: TrainingOptions, recompute: tuple[str, ...] | None = None
                   ) -> Graph:
    """The graph priced under ``options``: cast to the compute dtype, ``attrs["train"]`` set.

    ``recompute``: block paths to recompute (default: every repeated block when
    ``options.recompute``, none otherwise)."""
    if recompute is None:
        recompute = recomputed_blocks(graph, options)
    members: dict[int, str] = {}
    for b in repeated_blocks(graph):
        if b.path in recompute:
            members.update((i, b.path) for i in b.nodes)
    if options.recompute == RECOMPUTE_ATTENTION:  # each attention core on its own (attention_core.py)
        members.update(attention_members(graph))
    plain = options.zero == 0 and not options.mixed and not members
    if plain:
        return graph
    dtype = options.compute_dtype
    seen: set[tuple[str, int]] = set()  # block inputs already kept by an earlier node of the block
    inside = {graph.nodes[i].name: p for i, p in members.items()}
    nodes = []
    for i, n in enumerate(graph.nodes):
        block = members.get(i)
        saved: tuple[int, ...] = ()
        if block is not None:
            keep = []
            for k, op in enumerate(n.inputs):
                external = not (op.is_node and inside.get(op.source) == block)
                key = (block + "|" + op.source, op.output)
                if external and key not in seen and op.spec.dtype.startswith(("float", "bfloat")):
                    seen.add(key)
                    keep.append(k)
            saved = tuple(keep)
        rec = NodeTraining(zero=options.zero if n.params else 0, master=options.mixed and bool(n.params),
                           recompute=block is not None, saved_inputs=saved,
                           kept=block is not None and options.recompute == RECOMPUTE_POINTWISE and keeps_output(n))
        m = _cast_node(n, dtype) if options.mixed else n
        attrs = dict(m.attrs)
        attrs["train"] = rec
        nodes.append(dataclasses.replace(m, attrs=attrs))
    inputs = {k: _cast_spec(v, dtype) if options.mixed else v for k, v in graph.inputs.items()}
    return Graph(nodes, inputs, list(graph.outputs), graph.model_name, graph.fx_graph)


def _shape_of(node: Node) -> tuple:
    """What two blocks' nodes at the same place must share to be the same block. An attribute
    naming one of the node's own weights (``weight_views.WEIGHT_VIEW``: each layer's own
    parameter path) is compared by the weight's place among the node's parameters."""
    attrs = dict(node.attrs)
    view = attrs.get(WEIGHT_VIEW)
    sources = [o.source for o in node.params]
    if view in sources:
        attrs[WEIGHT_VIEW] = ("param", sources.index(view))
    return (node.op, node.dims, tuple(o.spec for o in node.inputs), tuple(o.spec for o in node.params),
            node.outputs, node.flops, repr(sorted(attrs.items(), key=str)))


@dataclass(frozen=True)
class Window:
    """A short stand-in for a deep graph: prologue, ``k`` blocks, epilogue (``graph``), and for
    every unit of the full graph the unit of the window that stands for it (``unit_map``)."""

    graph: Graph
    spans: list[tuple[int, int]]
    unit_map: list[int]
    node_map: list[int]  # node of the full graph -> the window's node that stands for it


def block_window(graph: Graph, k: int = 3) -> Window | None:
    """The window, or None when the graph has fewer than ``k + 1`` blocks or they differ.

    The blocks of the full graph are the window's first block (the first), its middle blocks
    (every block in between) and its last block (the last), so what happens at the ends (the
    embedding's layout flowing into the first block, the head reading the last) is kept."""
    blocks = repeated_blocks(graph)
    spans = units(graph, blocks)
    if len(blocks) < k + 1:
        return None
    first = 1 if blocks[0].nodes[0] > 0 else 0  # index of the first block's unit
    block_units = spans[first:first + len(blocks)]
    size = block_units[0][1] - block_units[0][0]
    if any(b - a != size for a, b in block_units):
        return None
    ref = [_shape_of(graph.nodes[i]) for i in range(*block_units[0])]
    for a, _ in block_units[1:]:
        if any(_shape_of(graph.nodes[a + j]) != ref[j] for j in range(size)):
            return None
    keep_until = block_units[k - 1][1]
    tail_start = block_units[-1][1]
    window_last_a = block_units[k - 1][0]
    rename: dict[str, str] = {}
    for u, (a, b) in enumerate(block_units[k:]):
        for j in range(b - a):  # a removed block's node -> the same node of the window's last block
            rename[graph.nodes[a + j].name] = graph.nodes[window_last_a + j].name
    nodes = list(graph.nodes[:keep_until])
    for n in graph.nodes[tail_start:]:
        ins = tuple(Operand(rename.get(o.source, o.source), o.output, o.spec) for o in n.inputs)
        nodes.append(dataclasses.replace(n, inputs=ins))
    outputs = [(rename.get(s, s), i) for s, i in graph.outputs]
    wg = Graph(nodes, dict(graph.inputs), outputs, graph.model_name, None)
    wspans = units(wg)
    last = len(blocks) - 1
    return window_of(wg, spans, wspans, first, len(blocks),
                     lambda j: first + (0 if j == 0 else k - 1 if j == last else min(j, k - 2)))


def window_of(wg: Graph, spans: list, wspans: list, first: int, nblocks: int, block_unit) -> "Window":
    """The ``Window`` of ``wg`` for a graph of units ``spans``: the prologue's units map to
    themselves, block j to the window's unit ``block_unit(j)``, the epilogue's to the window's
    last units; each node to its place in the unit it maps to."""
    unit_map = []
    for u in range(len(spans)):
        if u < first:
            unit_map.append(u)
        elif u < first + nblocks:
            unit_map.append(block_unit(u - first))
        else:
            unit_map.append(len(wspans) - (len(spans) - u))
    node_map = []
    for u, (a, b) in enumerate(spans):
        wa = wspans[unit_map[u]][0]
        node_map.extend(range(wa, wa + (b - a)))
    return Window(wg, wspans, unit_map, node_map)
