"""Which dim of each node is the batch dim: the basis of the data-parallel baseline.

The first axis of every graph input is a batch axis. A node dim that indexes a batch axis of one of
its data inputs (as the major dim of a merged axis, so ``view(b*s, v)`` keeps ``b``; a reduction dim
too, as in a loss averaged over the batch) is a batch dim,
and every output axis whose major dim is a batch dim is a batch axis for the consumers. Parameters
never carry the batch. The propagation is a single pass in topological order.
"""

from __future__ import annotations

from autopar.core.ir import Graph, Node


def batch_dims(graph: Graph) -> dict[str, str | None]:
    """Node name -> the name of its batch dim (None where the node has none)."""
    batch_axes: dict[tuple[str, int], set[int]] = {}  # (source, output) -> batch axes of that tensor
    for name, spec in graph.inputs.items():
        if len(spec.shape) >= 1:
            batch_axes[(f"input:{name}", 0)] = {0}
    result: dict[str, str | None] = {}
    sized = _batch_sized(graph)
    for node in graph.nodes:
        dim = _batch_dim_of(node, batch_axes)
        if dim is None:  # an axis the exporter traced at the batch's size (built from it alone)
            dim = next((node.outputs[j].axes[i][0] for j, i in sized.get(node.name, ())
                        if j < len(node.outputs) and i < len(node.outputs[j].axes) and node.outputs[j].axes[i]), None)
        result[node.name] = dim
        for j, out in enumerate(node.outputs):
            axes = {i for i, a in enumerate(out.axes) if dim is not None and a[:1] == (dim,)}
            if axes:
                batch_axes[(node.name, j)] = axes
    return result


def _batch_sized(graph: Graph) -> dict:
    """Node -> (output, axis) pairs torch.export traced at the batch's size (``frontend.export``)."""
    gm = graph.fx_graph
    return dict(getattr(gm, "meta", {}).get("autopar_batch_axes", {})) if gm is not None else {}


def _batch_dim_of(node: Node, batch_axes: dict[tuple[str, int], set[int]]) -> str | None:
    for op in node.inputs:
        for i in sorted(batch_axes.get((op.source, op.output), ())):
            if i < len(op.spec.axes) and op.spec.axes[i]:
                # a loss that averages over the batch has it as a reduction dim; it is still
                # the batch: data parallelism splits it and sums the partial losses
                return op.spec.axes[i][0]
    return None


def _rescaled(graph: Graph, scale) -> list[tuple[Node, Node | None]]:
    """(node, the node with its batch dim and every tensor axis that dim leads passed through
    ``scale(size, what)``) per node; None for a node without a batch dim. ``what`` names the size
    for ``scale``'s error. FLOPs and bytes are the callers' to restate."""
    import dataclasses

    from autopar.core.ir import Dim, Operand

    dims = batch_dims(graph)

    def respec(spec, b: str, what: str):
        return dataclasses.replace(spec, shape=tuple(scale(s, what) if axis[:1] == (b,) else s
                                                     for s, axis in zip(spec.shape, spec.axes)))

    out = []
    for n in graph.nodes:
        b = dims[n.name]
        if b is None:
            out.append((n, None))
            continue
        new_dims = tuple(Dim(d.name, scale(d.size, f"batch dim {d.name} of {n.name}"), d.reduction, d.splittable)
                         if d.name == b else d for d in n.dims)
        inputs = tuple(Operand(o.source, o.output, respec(o.spec, b, f"an input of {n.name}")) for o in n.inputs)
        outputs = tuple(respec(t, b, f"an output of {n.name}") for t in n.outputs)
        out.append((n, dataclasses.replace(n, dims=new_dims, inputs=inputs, outputs=outputs)))
    return out


def scale_batch(graph: Graph, microbatches: int) -> Graph:
    """The same graph for one of ``microbatches`` equal microbatches: every batch dim and batch axis
    divided, FLOPs and activation bytes of batched nodes scaled to match; parameters unchanged.

    Used to price pipeline stages per microbatch with the same cost model (so a roofline sees the
    smaller shards). Raises ValueError when a batch size is not divisible.
    """
    import dataclasses

    if microbatches == 1:
        return graph

    def divided(size: int, what: str) -> int:
        if size % microbatches:
            raise ValueError(f"{what} has size {size}, not divisible into {microbatches} microbatches")
        return size // microbatches

    nodes = []
    for n, m in _rescaled(graph, divided):
        if m is None:
            nodes.append(n)
            continue
        read = n.bytes_read - sum(o.spec.nbytes - s.spec.nbytes for o, s in zip(n.inputs, m.inputs))
        if n.op == "embedding":  # it reads the gathered rows, one per index: all of it scales
            read = n.bytes_read // microbatches
        written = n.bytes_written - sum(o.nbytes - s.nbytes for o, s in zip(n.outputs, m.outputs))
        nodes.append(dataclasses.replace(m, flops=n.flops // microbatches, bytes_read=max(read, 0),
                                         bytes_written=max(written, 0)))
    inputs = {}
    for name, spec in graph.inputs.items():
        shape = list(spec.shape)
        if shape and shape[0] % microbatches == 0:
            shape[0] //= microbatches
        inputs[name] = dataclasses.replace(spec, shape=tuple(shape))
    return dataclasses.replace(graph, nodes=nodes, inputs=inputs, outputs=list(graph.outputs))


def traced_batch(graph: Graph) -> int | None:
    """The batch size the graph was traced with: dim 0 of its batched inputs (None: no input has one)."""
    call = graph.call
    if call is not None and call.batch is not None:
        return int(call.batch)
    sizes = [spec.shape[0] for spec in graph.inputs.values() if spec.shape]
    return max(set(sizes), key=sizes.count) if sizes else None


def with_batch(graph: Graph, size: int) -> Graph:
    """The same graph for a global batch of ``size`` (instead of the traced one): every batch dim
    and every tensor axis led by one scaled by ``size / traced``, the inputs' batch axes set to
    ``size``; FLOPs and bytes are left as traced (codegen reads sizes, not costs).

    What a compiled module builds its program from when a call's batch differs from the traced
    one. Raises ValueError when a batch dim is not a whole multiple of the traced batch (an op
    that mixes the batch into another axis: its size at another batch is unknown).
    """
    import dataclasses

    old = traced_batch(graph)
    if old is None or size == old:
        return graph

    def scaled(n: int, what: str) -> int:
        if n % old:
            raise ValueError(f"{what} has size {n}, not a multiple of the traced batch {old}: this module "
                             f"runs batches of {old} only; compile it again with a batch of {size}")
        return n // old * size

    nodes = [n if m is None else m for n, m in _rescaled(graph, scaled)]
    inputs = {name: dataclasses.replace(spec, shape=(size, *spec.shape[1:])) if spec.shape and spec.shape[0] == old
              else spec for name, spec in graph.inputs.items()}
    out = dataclasses.replace(graph, nodes=nodes, inputs=inputs, outputs=list(graph.outputs))
    out.call = dataclasses.replace(graph.call, batch=size) if graph.call is not None else None
    return out
