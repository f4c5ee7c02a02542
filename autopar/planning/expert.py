"""The Megatron-style "expert" plan for transformer-like graphs, as pins on the search.

An expert splits the linears of every repeated block by hand: the first linear of a pair is
column-parallel (its output features ``n`` split over the tensor-parallel axes), the next one,
which reads the sharded activations, row-parallel (its reduction ``k`` split, outputs partial).
Everything else in the block follows: the attention core takes the heads, elementwise ops keep
their input's split. autopar expresses that as *pins*: the linears get exactly these configs, the
batch dim of every node is split over the data-parallel axes, and the search completes the rest at
the lowest cost under the same cost model. So the baseline is the best plan of the Megatron
family, which is the fair thing to compare with.

Tensor-parallel axes: the mesh axes inside one node (level 0), as many as divide every pinned
linear's split dim; the other axes are data-parallel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from autopar.core.ir import Graph, Node

_BLOCK = re.compile(r"(^|\.)\d+(\.|$)")  # a module path inside a ModuleList / Sequential entry


@dataclass(frozen=True)
class Pin:
    """Required mesh axes per dim name for one node.

    ``exact``: every other dim is unsplit (the pinned linears). Otherwise other dims may use any
    mesh axis except the data-parallel ones ``dp`` (the free nodes that follow the linears).
    """

    dims: dict[str, tuple[int, ...]]
    dp: tuple[int, ...] = ()
    exact: bool = False


def is_transformer_like(graph: Graph) -> bool:
    ops = {n.op for n in graph.nodes}
    has_attention = "sdpa" in ops or ("softmax" in ops and ("matmul" in ops or "einsum" in ops))
    # LayerNorm, or RMSNorm written out (Llama: pow, mean, rsqrt, mul)
    has_norm = "layer_norm" in ops or any(n.op == "reduce" and n.attrs.get("fn") == "mean" for n in graph.nodes)
    return has_attention and has_norm and any(_linear_like(n) for n in graph.nodes)


def _linear_like(node: Node) -> bool:
    """A linear, or a matmul by a 2-D weight (GPT-2's Conv1D: ``addmm(bias, x, W)``)."""
    return node.op == "linear" or (node.op == "matmul" and any(len(p.spec.shape) == 2 for p in node.params))


def tensor_parallel_axes(graph: Graph, mesh_shape, mesh_level, linears) -> tuple[int, ...]:
    """The largest set of intra-node mesh axes whose product divides every pinned split dim."""
    chosen: list[int] = []
    prod = 1
    for a, (size, level) in enumerate(zip(mesh_shape, mesh_level or (0,) * len(mesh_shape))):
        if level != 0:
            continue
        if all(graph.node(name).dim(dim).size % (prod * size) == 0 for name, dim in linears.items()):
            chosen.append(a)
            prod *= size
    return tuple(chosen)


def expert_pins(graph: Graph, batch: dict[str, str | None], mesh_shape, mesh_level=()) -> dict[str, Pin]:
    """Pins for every node: linears column/row per Megatron, batch over the data-parallel axes."""
    sharded: set[tuple[str, int]] = set()  # tensors downstream of a column linear, not yet reduced
    roles: dict[str, str] = {}  # linear node -> the dim it splits ("n" column, "k" row)
    for node in graph.nodes:
        reads_sharded = any((op.source, op.output) in sharded for op in node.inputs)
        if _linear_like(node) and _BLOCK.search(node.module or ""):
            roles[node.name] = "k" if reads_sharded else "n"
            if not reads_sharded:
                sharded.add((node.name, 0))
        elif reads_sharded and not _linear_like(node) and node.op not in ("layer_norm", "cross_entropy"):
            sharded.update((node.name, j) for j in range(len(node.outputs)))
    linears = {name: _dim_named(graph, name, role) for name, role in roles.items()}
    tp = tensor_parallel_axes(graph, mesh_shape, mesh_level, linears)
    dp = tuple(a for a in range(len(mesh_shape)) if a not in tp)
    pins = {}
    for node in graph.nodes:
        dims: dict[str, tuple[int, ...]] = {}
        b = batch.get(node.name)
        if b is not None:
            dims[b] = dp
        if node.name in linears and tp:
            dims[linears[node.name]] = tp
        pins[node.name] = Pin(dims, dp, exact=node.name in linears)
    return pins


def _dim_named(graph: Graph, node: str, role: str) -> str:
    """The linear's output-feature dim ('n') or reduction dim ('k'), whatever the rule named them."""
    n = graph.node(node)
    reductions = [d.name for d in n.dims if d.reduction]
    if role == "k":
        return reductions[0]
    weight = next(p for p in n.params if len(p.spec.shape) == 2)
    return next(a[0] for a in weight.spec.axes if a and not n.dim(a[0]).reduction)  # (n, k) or Conv1D's (k, n)


def matches(pin: Pin, dim_names, mesh_axes) -> bool:
    """Does a config (its mesh axes per dim, aligned with ``dim_names``) satisfy a pin?"""
    if any(name not in dim_names for name in pin.dims):
        return False
    for name, axes in zip(dim_names, mesh_axes):
        if name in pin.dims:
            if tuple(axes) != tuple(pin.dims[name]):
                return False
        elif axes and (pin.exact or set(axes) & set(pin.dp)):
            return False
    return True
