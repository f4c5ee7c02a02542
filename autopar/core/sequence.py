"""Which dim of each node runs along the sequence: what the report names ``seq`` in a split.

Sequence axes start at the second axis of every 2-D integer graph input (token ids and labels,
``(batch, seq)``) and at attention's query and key positions (``l`` and ``m`` of an sdpa node,
whatever reached them). A node dim that indexes a sequence axis of one of its data inputs (as
the major dim of that axis) is a sequence dim, and an output axis led by a sequence dim is a
sequence axis for the consumers: one pass in topological order, as ``batch.batch_dims``.
Names only: nothing in planning or codegen depends on them (``balanced_causal`` is a rule that
codegen and the cost models share, on an attention node alone).
"""

from __future__ import annotations

from autopar.core.ir import Graph

ATTENTION_POSITIONS = ("l", "m")  # an sdpa node's query and key positions


def sequence_dims(graph: Graph) -> dict[str, set[str]]:
    """Node name -> the names of its dims that run along the sequence (possibly empty)."""
    seq_axes: dict[tuple[str, int], set[int]] = {}
    for name, spec in graph.inputs.items():
        if len(spec.shape) == 2 and not spec.dtype.startswith(("float", "bfloat", "complex", "bool")):
            seq_axes[(f"input:{name}", 0)] = {1}
    result: dict[str, set[str]] = {}
    for node in graph.nodes:
        dims: set[str] = set()
        for op in node.inputs:
            for i in seq_axes.get((op.source, op.output), ()):
                if i < len(op.spec.axes) and op.spec.axes[i]:
                    dims.add(op.spec.axes[i][0])
        if node.op == "sdpa":
            dims |= {d.name for d in node.dims if d.name in ATTENTION_POSITIONS}
        result[node.name] = dims
        for j, out in enumerate(node.outputs):
            axes = {i for i, a in enumerate(out.axes) if a[:1] and a[0] in dims}
            if axes:
                seq_axes[(node.name, j)] = axes
    return result


def balanced_causal(node, parts: int) -> bool:
    """Whether a causal attention (``is_causal`` or an explicit mask: HF's causal one) whose
    query rows ``l`` are cut into ``parts`` is run balanced: each rank's rows exchanged for chunks
    ``i`` and ``2 parts - 1 - i`` of ``2 parts`` (``codegen/causal_balance.py``), which needs an
    even number of rows per rank."""
    return (node.op == "sdpa" and parts > 1 and bool(node.attrs.get("is_causal") or node.attrs.get("mask"))
            and node.dim("l").size % (2 * parts) == 0)
