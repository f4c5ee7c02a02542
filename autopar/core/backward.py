"""Which nodes autograd records no backward for: those nothing of which takes a gradient.

A node runs a backward only where one of its inputs or parameters takes a gradient: a trainable
parameter (``ir.trainable``), or the floating-point output of a node that runs one. What a model
builds from its inputs' shapes and its buffers alone (a Hugging Face attention mask from
``arange``, comparisons and ``where``; rotary tables from ``inv_freq``; position ids) takes none,
so the step runs its forward only. The cost models price a node's backward as a multiple of its
forward, ``Cluster.op_overhead`` included, so without this mark every such node was priced a
backward (two op overheads on a CPU: the small Llama's first pipeline stage, mostly its mask,
was priced 3.4x what it ran). Marked once at trace time (``NO_BACKWARD`` in ``Node.attrs``).
"""

from __future__ import annotations

from autopar.core.ir import FLOAT_DTYPES, Graph, trainable

# Node.attrs key: True where autograd records no backward for the node (see the module docstring)
NO_BACKWARD = "no_backward"


def mark_no_backward(graph: Graph) -> set[str]:
    """Set ``NO_BACKWARD`` on every node of ``graph`` that runs no backward; returns their names."""
    grad: set[str] = set()  # nodes whose output takes a gradient
    none: set[str] = set()
    for n in graph.nodes:
        if any(trainable(n)) or any(o.source in grad for o in n.inputs):
            if any(s.dtype in FLOAT_DTYPES for s in n.outputs):
                grad.add(n.name)
            continue
        none.add(n.name)
        n.attrs[NO_BACKWARD] = True
    return none


def runs_backward(node) -> bool:
    """Whether autograd runs a backward for ``node`` (``mark_no_backward``; unmarked: it does)."""
    return not (node.attrs or {}).get(NO_BACKWARD, False)
