"""Context parallelism in the hierarchical step price: each sequence split over ``c`` ranks.

What a rank does (Llama 3, Dubey et al. 2024, section 3.3.2): every op but attention works on its
own ``s / c`` tokens; attention needs the keys and values of every earlier token, so each layer
all-gathers K and V over the ``c`` ranks before attention (in the forward and in a recomputed
forward) and reduce-scatters their gradients after it (in the backward). The sequence is cut into
``2c`` chunks, rank ``i`` holding chunks ``i`` and ``2c - 1 - i``, so causal attention's work is
the same on every rank: per rank, compute, tensor-parallel traffic, activations and pipeline
sends are ``1 / c`` of the whole sequence's. Parameters are replicated over the context group
and their gradients reduced over context x data (``step_price.data_groups``).

Priced as Llama 3 runs it: the gathers are on the critical path, not overlapped (its paper says
so); a ring that passes K/V blocks while attention computes would hide them behind attention.
K and V are gathered as attention's inputs before a grouped-query expansion (the smallest tensor
on the view/slice/expand chain into ``scaled_dot_product_attention``), split over the tensor
group by heads.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from autopar.core.ir import Graph
from autopar.cost_models.alpha_beta import collective_time
from autopar.planning.units import UnitStats

_VIEWS = ("view", "slice", "permute")


def _source_bytes(graph: Graph, name: str, nbytes: int) -> int:
    """The least bytes on the chain of views, slices and expands that ends in ``name``."""
    nodes = {n.name: n for n in graph.nodes}
    best = nbytes
    node = nodes.get(name)
    while node is not None and (node.op in _VIEWS or node.name.startswith("expand")) and node.inputs:
        op = node.inputs[0]
        if not op.is_node:
            break
        best = min(best, op.spec.nbytes)
        node = nodes.get(op.source)
    return best


def kv_bytes(graph: Graph, spans: list[tuple[int, int]]) -> np.ndarray:
    """Per unit: bytes of the keys and values its attention reads, at the graph's batch.
    ValueError when the graph has no ``scaled_dot_product_attention``: context parallelism is
    priced for that op only."""
    out = np.zeros(len(spans))
    found = False
    for u, (a, b) in enumerate(spans):
        for node in graph.nodes[a:b]:
            if node.op != "sdpa":
                continue
            found = True
            for op in node.inputs[1:3]:
                out[u] += _source_bytes(graph, op.source, op.spec.nbytes) if op.is_node else op.spec.nbytes
    if not found:
        raise ValueError("a context degree is priced for attention written with "
                         "F.scaled_dot_product_attention; this model has none (write its attention with it, "
                         "or leave context out of the pin)")
    return out


def context_stats(s: UnitStats, kv: np.ndarray, context: int, tensor: int, bandwidth: float, latency: float,
                  call_latency: float, recompute: bool) -> UnitStats:
    """``s`` (one tensor group's units for a microbatch of whole sequences) as one rank of a
    context group of ``context``: per-token work and memory / context, plus the K/V gathers
    (forward, recomputed forward) and the gradients' reduce-scatter (backward) per microbatch.
    ``kv``: ``kv_bytes`` at the microbatch's sequences."""
    c = context
    if c <= 1:
        return s
    per_device = kv / tensor  # heads split over the tensor group
    gather = collective_time("all-gather", per_device, c, bandwidth, latency, call_latency)
    scatter = collective_time("reduce-scatter", per_device, c, bandwidth, latency, call_latency)
    comm = gather * (2 if recompute else 1) + scatter
    comm = np.where(kv > 0, comm, 0.0)
    gathered = per_device * (c - 1) / c  # the other ranks' K/V, saved for attention's backward
    return dataclasses.replace(
        s, compute=s.compute / c, comm=s.comm / c + comm, acts=s.acts / c + (0.0 if recompute else gathered),
        full_acts=s.full_acts / c + gathered, boundary=s.boundary / c,
        transient=s.transient / c if s.transient is not None else None)  # the loss's rows split too


__all__ = ["context_stats", "kv_bytes"]
