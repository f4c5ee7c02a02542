"""Weight views: a node computed from one weight and constants alone (a slice of a position
embedding, or its lookup of ``arange`` positions), whose gradient may come back as partial sums
and join the weight's own gradient sync.

Under data parallelism a GPT's ``pos_emb[:seq]`` is replicated (it has no batch dim) while the
``add`` that reads it is batch-split, so the ``add``'s gradient for it is a partial sum over the
batch axes. Summed where the view is made (a blocking all-reduce in the middle of the backward),
it cost 4 gloo processes about 7 ms a step beside DDP, which sums that gradient in a bucket with
the others, overlapped with the backward. The gradient of any op is linear in its output's
gradient, so the partial terms can go through the replicated view unchanged and be summed as the
weight's gradient: in a bucket.

``mark_weight_views`` finds such nodes once the front end has built the graph and records the
weight in ``Node.attrs["weight_view"]``; the cost model (``AnalyticModel.edge_cost``, its
collective list) and codegen (``program._Builder``) both ask ``lifted_grad_axes`` which mesh axes
of one reader's gradient are summed with the weight's instead of on the edge, so that what is
priced is what runs.
"""

from __future__ import annotations

import dataclasses

from autopar.core.ir import Node
from autopar.core.layout import Layout, Partial, Replicate

WEIGHT_VIEW = "weight_view"  # Node.attrs key: the weight (operand source) the node is a view of


def mark_weight_views(nodes: list[Node], outputs: list[tuple[str, int]]) -> list[Node]:
    """``nodes`` with ``attrs["weight_view"]`` set on each node that reads one weight no other node
    reads and otherwise only constants (values no input and no weight flows into: the positions
    ``torch.arange(seq)`` of ``pos_emb(positions)``), and whose one output has exactly one reader
    (an edge of the graph, not a graph output)."""
    readers: dict[str, int] = {}
    uses: dict[str, int] = {}
    constant: set[str] = set()
    for n in nodes:
        if not n.params and all(op.is_node and op.source in constant for op in n.inputs):
            constant.add(n.name)
        for op in n.params:
            readers[op.source] = readers.get(op.source, 0) + 1
        for op in n.inputs:
            if op.is_node:
                uses[op.source] = uses.get(op.source, 0) + 1
    returned = {name for name, _ in outputs}
    out = []
    for n in nodes:
        if (all(op.is_node and op.source in constant for op in n.inputs) and len(n.params) == 1
                and len(n.outputs) == 1 and readers[n.params[0].source] == 1
                and uses.get(n.name) == 1 and n.name not in returned and n.supported):
            n = dataclasses.replace(n, attrs={**n.attrs, WEIGHT_VIEW: n.params[0].source})
        out.append(n)
    return out


def lifted_grad_axes(src: Node, src_layout: Layout, dst_layout: Layout, dst_grad: Layout) -> tuple[int, ...]:
    """The mesh axes along which the reader's gradient for ``src``'s output is left partial and
    summed with the weight's gradient (in its bucket) rather than on the edge; () where the edge
    reshards it as usual. Only where nothing else moves: ``src`` is a weight view, replicated on
    every axis, the reader takes it as it is, and the reader's gradient is, per axis, replicated
    or a partial sum."""
    if WEIGHT_VIEW not in src.attrs or src_layout != dst_layout:
        return ()
    if not all(isinstance(p, Replicate) for p in src_layout):
        return ()
    if not all(isinstance(g, (Replicate, Partial)) for g in dst_grad):
        return ()
    return tuple(a for a, g in enumerate(dst_grad) if isinstance(g, Partial))
