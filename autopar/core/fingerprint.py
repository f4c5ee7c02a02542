"""A stable fingerprint of a graph, so a saved plan is never applied to another model.

It hashes what a plan depends on (node names, ops, iteration spaces, tensor shapes and axis maps,
parameter names) and nothing incidental (FLOP counts, module objects, memory addresses).
"""

from __future__ import annotations

import hashlib
import json

from autopar.core.ir import Graph


def fingerprint(graph: Graph) -> str:
    rows = []
    for n in graph.nodes:
        rows.append([
            n.name, n.op,
            [[d.name, d.size, d.reduction, d.splittable] for d in n.dims],
            [[o.source, o.output, list(o.spec.shape), [list(a) for a in o.spec.axes]] for o in n.inputs],
            [[p.source, list(p.spec.shape)] for p in n.params],
            [list(t.shape) for t in n.outputs],
        ])
    text = json.dumps([rows, sorted(graph.inputs), graph.outputs], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
