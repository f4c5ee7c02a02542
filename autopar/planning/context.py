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
so). The ring (``Degrees.ring``, ``ring_stats``: ``cost_models/ring_attention.py``) passes K/V
chunks on while attention computes, hiding them behind its blocks, and saves only the local
chunk: the search prices both and keeps the faster that fits (the ring where the gathered K/V
does not).
K and V are gathered as attention's inputs before a grouped-query expansion (the smallest tensor
on the view/slice/expand chain into ``scaled_dot_product_attention``), split over the tensor
group by heads.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from autopar.core.ir import Graph
from autopar.cost_models.alpha_beta import collective_time
from autopar.cost_models.ring_attention import ring_in_flight, ring_times
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


def unit_attention_flops(graph: Graph, spans: list[tuple[int, int]]) -> np.ndarray:
    """Per unit: the forward FLOPs of its ``scaled_dot_product_attention`` calls, at the graph's batch."""
    return np.array([sum(float(n.flops) for n in graph.nodes[a:b] if n.op == "sdpa") for a, b in spans])


MIN_TOKENS = 1024  # a context rank's least tokens: thinner query blocks leave attention's matmuls too thin


def context_options(graph: Graph) -> tuple[int, ...]:
    """The context degrees the search tries: powers of two ``c`` with the sequence a multiple of
    ``2c`` (the balanced layout's chunks) and at least ``MIN_TOKENS`` tokens per rank, for a language model whose attention is causal
    self-attention over its token sequence: every ``scaled_dot_product_attention`` has as many
    query as key positions, the length of a 2-D integer input's second axis (token ids), and is
    causal by ``is_causal`` or by an explicit mask. () for any other graph: the pricing below
    holds for that attention only (every other op works on its own tokens)."""
    sdpa = [n for n in graph.nodes if n.op == "sdpa"]
    tokens = {spec.shape[1] for spec in graph.inputs.values()
              if len(spec.shape) == 2 and not spec.dtype.startswith(("float", "bfloat", "complex", "bool"))}
    if not sdpa:
        return ()
    lengths = {(n.dim("l").size, n.dim("m").size) for n in sdpa}
    if len(lengths) != 1 or not all(n.attrs.get("is_causal") or n.attrs.get("mask") for n in sdpa):
        return ()
    (q, k), = lengths
    if q != k or q not in tokens:
        return ()
    return tuple(2 ** i for i in range(1, q.bit_length()) if q % 2 ** (i + 1) == 0 and q // 2 ** i >= MIN_TOKENS)


def gather_times(kv: np.ndarray, context: int, tensor: int, bandwidth: float, latency: float,
                 call_latency: float, recompute: bool) -> np.ndarray:
    """Per unit and microbatch: the K/V all-gathers (forward, recomputed forward) and their
    gradients' reduce-scatter (backward) of one rank of a context group of ``context``."""
    per_device = kv / tensor  # heads split over the tensor group
    gather = collective_time("all-gather", per_device, context, bandwidth, latency, call_latency)
    scatter = collective_time("reduce-scatter", per_device, context, bandwidth, latency, call_latency)
    return np.where(kv > 0, gather * (2 if recompute else 1) + scatter, 0.0)


def context_stats(s: UnitStats, kv: np.ndarray, context: int, tensor: int, bandwidth: float, latency: float,
                  call_latency: float, recompute: bool) -> UnitStats:
    """``s`` (one tensor group's units for a microbatch of whole sequences) as one rank of a
    context group of ``context``: per-token work and memory / context, plus the K/V gathers
    (forward, recomputed forward) and the gradients' reduce-scatter (backward) per microbatch.
    ``kv``: ``kv_bytes`` at the microbatch's sequences."""
    c = context
    if c <= 1:
        return s
    per_device = kv / tensor
    comm = gather_times(kv, c, tensor, bandwidth, latency, call_latency, recompute)
    gathered = per_device * (c - 1) / c  # the other ranks' K/V, saved for attention's backward
    return dataclasses.replace(
        s, compute=s.compute / c, comm=s.comm / c + comm, acts=s.acts / c + (0.0 if recompute else gathered),
        full_acts=s.full_acts / c + gathered, boundary=s.boundary / c,
        transient=s.transient / c if s.transient is not None else None,  # the loss's rows split too
        **per_token(s, c))


def ring_stats(s: UnitStats, kv: np.ndarray, attention: np.ndarray, context: int, tensor: int, bandwidth: float,
               latency: float, call_latency: float, recompute: bool) -> UnitStats:
    """``context_stats`` with attention run as a ring (``cost_models/ring_attention.py``): its
    hops' exposed seconds in place of the gathers; no other rank's K/V saved, and the chunks in
    flight held once, beside the stage's activations (``transient``, at the unit with the
    largest). ``attention``: per unit, the forward attention's seconds for the whole sequences of
    the microbatch on one device."""
    c = context
    if c <= 1:
        return s
    comm = ring_times(kv, attention, c, tensor, bandwidth, latency, call_latency, recompute)
    held = np.zeros(len(kv)) if s.transient is None else s.transient / c
    if len(kv):
        held[int(np.argmax(kv))] += ring_in_flight(kv, c, tensor)
    return dataclasses.replace(
        s, compute=s.compute / c, comm=s.comm / c + comm, acts=s.acts / c, full_acts=s.full_acts / c,
        boundary=s.boundary / c, transient=held, **per_token(s, c))


def per_token(s: UnitStats, c: int) -> dict:
    """The backward's gradients above the saved activations and the tensors a stage sends, at 1/c
    (``UnitStats.backward``, ``sent``): each rank's are its sequence chunk's."""
    return {f: getattr(s, f) / c for f in ("backward", "sent") if getattr(s, f) is not None}


def rank_stats(s: UnitStats, kv: np.ndarray, attention: np.ndarray, deg, bandwidth: float, latency: float,
               call_latency: float, recompute: bool) -> UnitStats:
    """``ring_stats`` or ``context_stats``, as the degrees ``deg`` run context parallelism."""
    if deg.ring:
        return ring_stats(s, kv, attention, deg.c, deg.t, bandwidth, latency, call_latency, recompute)
    return context_stats(s, kv, deg.c, deg.t, bandwidth, latency, call_latency, recompute)


def exchange_times(kv: np.ndarray, attention: np.ndarray, deg, bandwidth: float, latency: float,
                   call_latency: float, recompute: bool) -> np.ndarray:
    """Per unit and microbatch: the ring's exposed hops or the K/V gathers, as ``deg`` runs them."""
    if deg.ring:
        return ring_times(kv, attention, deg.c, deg.t, bandwidth, latency, call_latency, recompute)
    return gather_times(kv, deg.c, deg.t, bandwidth, latency, call_latency, recompute)


__all__ = ["context_options", "context_stats", "exchange_times", "gather_times", "kv_bytes", "rank_stats", "ring_stats",
           "unit_attention_flops"]
