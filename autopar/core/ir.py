"""The operator graph that every later stage reads.

A node owns an *iteration space*: named dimensions with sizes, some of them reductions. Every tensor
the node touches (data inputs, parameters, outputs) says, axis by axis, which of those dimensions
index it. That single mapping is what makes a split meaningful everywhere downstream:

* a split of dim ``d`` by ``k`` shards every tensor axis indexed by ``d`` into ``k`` pieces;
* a tensor axis that no split dim indexes is replicated;
* a split reduction dim leaves the outputs as partial sums (an all-reduce or reduce-scatter);
* a parameter that a split dim does not index is replicated over those devices, so its gradient
  needs an all-reduce over them.

An axis may be indexed by several dims, major first: a ``view`` from ``(b, s, h*d)`` to
``(b, s, h, d)`` gives the merged input axis ``("h", "d")``. Splitting the major dim of a merged
axis keeps the shards contiguous; splitting a minor one does not, and the cost model prices that
as a reshuffle. An axis indexed by no dim at all (``()``) is one the node cannot split, e.g. the
spatial axes of a convolution's input (the halo makes them not a plain shard).

Nothing here knows about devices, costs or searches: the graph is the input of all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from autopar.core.call import CallSpec

AxisDims = tuple[str, ...]  # the dims indexing one tensor axis, major first; () = unsplittable

# dtypes whose tensors carry gradients and optimizer state (parameters of other dtypes are buffers)
FLOAT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16", "complex64"})


@dataclass(frozen=True)
class Dim:
    """One dimension of a node's iteration space."""

    name: str
    size: int
    reduction: bool = False  # summed over: splitting it leaves partial sums in the outputs
    splittable: bool = True  # False where the op has no sharded form (e.g. conv kernel taps)


@dataclass(frozen=True)
class TensorSpec:
    """A tensor as one node sees it: shape, dtype, and which dims index each axis."""

    shape: tuple[int, ...]
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "float32", "int64"
    axes: tuple[AxisDims, ...]  # one entry per axis of shape

    def __post_init__(self) -> None:
        if len(self.axes) != len(self.shape):
            raise ValueError(f"TensorSpec: {len(self.axes)} axis maps for shape {self.shape}")

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES.get(self.dtype, 4)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
    "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8,
}


@dataclass(frozen=True)
class Operand:
    """A tensor a node reads: the output of another node, a graph input, or a parameter.

    ``source`` is a node name, ``"input:<placeholder>"`` for a graph input, or
    ``"param:<qualified name>"`` for a parameter or buffer of the model.
    """

    source: str
    output: int  # which output of the producing node (0 for inputs and parameters)
    spec: TensorSpec

    @property
    def is_param(self) -> bool:
        return self.source.startswith("param:")

    @property
    def is_input(self) -> bool:
        return self.source.startswith("input:")

    @property
    def is_node(self) -> bool:
        return not (self.is_param or self.is_input)


# Node.attrs key: the tensors a node reads for their dtype or device only (``x.type_as(y)``'s
# ``y``), as ``(source, output)`` pairs: in any layout, never resharded, never an operand.
METADATA_READS = "metadata_reads"

# Node.attrs key: positions in ``Node.params`` of the tensors that take no gradient (buffers such
# as a rotary embedding's cos/sin tables, parameters with ``requires_grad=False``): autograd keeps
# nothing for their gradient. Absent: every floating-point parameter takes one.
FROZEN_PARAMS = "frozen_params"


def trainable(node: "Node") -> list[bool]:
    """Per parameter of ``node``: does it take a gradient (floating point, not ``FROZEN_PARAMS``)."""
    frozen = node.attrs.get(FROZEN_PARAMS, ()) if node.attrs else ()
    return [p.spec.dtype in FLOAT_DTYPES and k not in frozen for k, p in enumerate(node.params)]


# Node.attrs key: ``{dim: carried}``: a mesh axis that cuts ``dim`` also shards the tensors indexed
# by ``carried`` (which no split of ``dim`` indexes), as if it cut ``carried``. A mixture of experts'
# expert dim carries its token dim: under expert parallelism the weights are split by expert and the
# tokens stay split as they came, each rank's tokens sent to their experts' ranks and back inside
# the node (an all-to-all), so its operands keep their token shards.
CARRIES = "carries"


def carried_dim(node: "Node", dim: str) -> str | None:
    """The dim whose tensors a cut of ``dim`` shards as well (``CARRIES``), or None."""
    return node.attrs.get(CARRIES, {}).get(dim) if node.attrs else None


@dataclass
class Node:
    """One operator with its iteration space.

    ``flops`` counts forward FLOPs the way ``torch.utils.flop_counter`` does (2 per multiply-add in
    matmul-like ops, convolutions and attention; 0 for memory-bound ops, which are priced by
    ``bytes_read + bytes_written`` instead).
    """

    name: str
    op: str  # rule name: "linear", "conv2d", "add", "opaque", ...
    target: str  # what the model called: "torch.nn.Linear", "torch.nn.functional.relu", ...
    module: str  # module path the node belongs to ("layers.0.attn.proj"), "" at the top
    dims: tuple[Dim, ...]
    inputs: tuple[Operand, ...]  # data inputs (node outputs and graph inputs), in call order
    params: tuple[Operand, ...]  # parameters and buffers the node reads
    outputs: tuple[TensorSpec, ...]
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    attrs: dict[str, Any] = field(default_factory=dict)  # op-specific: stride, eps, axis, ...
    unsupported: str = ""  # non-empty: why autopar replicates this node instead of splitting it

    @property
    def supported(self) -> bool:
        return not self.unsupported

    @property
    def param_count(self) -> int:
        return sum(p.spec.numel for p in self.params)

    @property
    def param_bytes(self) -> int:
        return sum(p.spec.nbytes for p in self.params)

    def dim(self, name: str) -> Dim:
        for d in self.dims:
            if d.name == name:
                return d
        raise KeyError(f"node {self.name} has no dim {name!r}; dims: {[d.name for d in self.dims]}")


@dataclass(frozen=True)
class Edge:
    """Data flowing from output ``src_output`` of ``src`` into input ``dst_input`` of ``dst``."""

    src: str
    src_output: int
    dst: str
    dst_input: int
    shape: tuple[int, ...]


@dataclass
class Graph:
    """Nodes in topological order, the model's inputs and which node outputs it returns.

    ``frontend`` says which graph the nodes come from ("fx": ``fx_graph`` is the symbolic trace;
    "export": ``fx_graph`` is the ``program``'s GraphModule, torch.export's training IR). Node names
    are the fx node names. ``call`` maps the model's call and return value onto ``inputs`` and
    ``outputs`` (``autopar.core.call.CallSpec``); none of these four is part of equality.
    """

    nodes: list[Node]
    inputs: dict[str, TensorSpec]  # placeholder name -> spec (axes are ())
    outputs: list[tuple[str, int]]  # (node name, output index); graph inputs as ("input:x", 0)
    model_name: str = ""
    fx_graph: Any = field(default=None, compare=False)  # the torch.fx.GraphModule traced, for codegen
    frontend: str = field(default="", compare=False)  # "fx", "export", or "" (built by hand)
    program: Any = field(default=None, compare=False)  # the torch.export.ExportedProgram (export only)
    call: CallSpec | None = field(default=None, compare=False, repr=False)
    source: Any = field(default=None, compare=False, repr=False)  # frontend.reuse.TracedFrom: what it was traced from

    def __post_init__(self) -> None:
        self._by_name = {n.name: n for n in self.nodes}

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def node(self, name: str) -> Node:
        return self._by_name[name]

    @property
    def edges(self) -> list[Edge]:
        out = []
        for n in self.nodes:
            for i, op in enumerate(n.inputs):
                if op.is_node:
                    out.append(Edge(op.source, op.output, n.name, i, op.spec.shape))
        return out

    @property
    def flops(self) -> int:
        return sum(n.flops for n in self.nodes)

    @property
    def unsupported(self) -> list[Node]:
        return [n for n in self.nodes if n.unsupported]

    @property
    def param_count(self) -> int:
        seen: dict[str, int] = {}
        for n in self.nodes:
            for p in n.params:
                seen[p.source] = p.spec.numel
        return sum(seen.values())

    def __str__(self) -> str:
        from autopar.core.graph_table import format_graph

        return format_graph(self)
