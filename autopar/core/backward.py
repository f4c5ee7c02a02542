"""What autograd does in a step's backward: which outputs take a gradient, which nodes run a
backward, and which inputs of a node get none.

Autograd computes a gradient only for a tensor that something trainable flows into: a node's
output takes one when the node reads a trainable parameter (``ir.trainable``) or an output that
takes one, and the output is floating point and depends on the input's values (not made fresh by
``zeros_like``). The model's inputs (the data batch, the labels), its buffers, and whatever it
builds from them alone (a Hugging Face attention mask from ``arange``, comparisons and ``where``;
rotary tables from ``inv_freq``; position ids) take none.

Three consumers, one answer (``needs_grad``), marked once at trace time in ``Node.attrs`` so that
it travels with the node into blocks, windows and pipeline stages, and into every cache key
(``op_signature`` reads ``attrs``):

* ``NO_BACKWARD``: a node whose output takes no gradient records no backward, so the step runs its
  forward only. The cost models price a node's backward as a multiple of its forward,
  ``Cluster.op_overhead`` included; without this mark every such node was priced a backward (two
  op overheads on a CPU: the small Llama's first pipeline stage, mostly its mask, was priced 3.4x
  what it ran).
* ``GRAD_FREE_INPUTS``: the floating-point inputs of a node that take no gradient. The op runner
  builds them without ``requires_grad``, so the backward it times is the one a step runs. The zoo
  MLP's first linear reads the data batch: timed with its input's gradient, its forward and
  backward took 9.3 ms on one core, 6.5 ms without (the 256x1024 @ 1024x512 matmul for that
  gradient is the difference), and the replicated plan's backward was priced 5 ms above what its
  ranks ran.
* the memory model holds a gradient only for the outputs that take one (``memory``,
  ``backward_set``).
"""

from __future__ import annotations

from autopar.core.ir import FLOAT_DTYPES, Graph, Node, trainable

# ``elementwise`` fns whose result does not depend on the input's values: no gradient flows back
FRESH_FNS = {"zeros_like", "ones_like", "full_like", "empty_like", "rand_like", "randn_like", "bernoulli"}

# Node.attrs key: True where autograd records no backward for the node
NO_BACKWARD = "no_backward"

# Node.attrs key: positions in ``Node.inputs`` of the floating-point inputs that take no gradient
# (a sorted tuple). Absent: every floating-point input takes one (graphs no front end built, such
# as PaSE's benchmark graphs, price as before).
GRAD_FREE_INPUTS = "grad_free_inputs"


def needs_grad(graph) -> set[str]:
    """Names of the nodes whose output takes a gradient (``graph``: a Graph or its nodes, in
    topological order)."""
    out: set[str] = set()
    for n in getattr(graph, "nodes", graph):
        if not any(s.dtype in FLOAT_DTYPES for s in n.outputs) or (n.op == "elementwise" and n.attrs.get("fn") in FRESH_FNS):
            continue
        if any(trainable(n)) or any(o.source in out for o in n.inputs):
            out.add(n.name)
    return out


def mark_backward(graph: Graph) -> set[str]:
    """Set ``NO_BACKWARD`` on every node of ``graph`` that runs no backward and ``GRAD_FREE_INPUTS``
    on every node with a floating-point input that takes no gradient; returns the names of the
    nodes that run no backward."""
    grad = needs_grad(graph)
    none: set[str] = set()
    for n in graph.nodes:
        if n.name not in grad:
            none.add(n.name)
            n.attrs[NO_BACKWARD] = True
        free = tuple(i for i, o in enumerate(n.inputs) if o.spec.dtype in FLOAT_DTYPES and o.source not in grad)
        if free:
            n.attrs[GRAD_FREE_INPUTS] = free
    return none


def runs_backward(node: Node) -> bool:
    """Whether autograd runs a backward for ``node`` (``mark_backward``; unmarked: it does)."""
    return not (node.attrs or {}).get(NO_BACKWARD, False)


def grad_free_inputs(node: Node) -> tuple[int, ...]:
    """Positions of ``node``'s inputs that take no gradient (``mark_backward``; unmarked: none)."""
    return tuple((node.attrs or {}).get(GRAD_FREE_INPUTS, ()))
