"""The price of context parallelism's attention run as a ring (``codegen/ring_attention.py``).

One rank of a context group of ``c`` holds ``1/c`` of the sequence's keys and values: its chunk,
``kv / (t c)`` bytes with the heads over a tensor group of ``t``. The forward passes chunks on
around the ring in ``c - 1`` hops (a send/recv each: ``a + N/bw``), each hop under one block of
attention (``1/c`` of the rank's attention work): only what a hop takes beyond its block is
exposed. The backward passes the K/V chunks on again (``c - 1`` hops) and each chunk's gradients
with them (``c`` hops, the last one bringing them home after the last block, exposed). A
recomputed forward runs its ring again. Before the ring the keys and values go to the balanced
causal layout and their gradients come back after it (an all-to-all of the local rows each way;
the queries' and outputs' exchanges are the all-gather variant's as well, priced with neither).

Memory: attention saves only its local chunks, already among the unit's activations at ``1/c``
(the all-gather variant saves the other ranks' ``(c - 1) / c`` as well, in every unit); in
flight while one attention runs, at most two K/V chunks and two of their gradients' (the
chunk held, the one arriving): ``4 kv / (t c)``, once, not per unit.
"""

from __future__ import annotations

import numpy as np

from autopar.cost_models.alpha_beta import collective_time

IN_FLIGHT = 4  # K/V chunks held at once by the backward's ring: current and next K/V, and their gradients


def chunk_bytes(kv: np.ndarray, context: int, tensor: int) -> np.ndarray:
    """Per unit: one rank's K/V chunk (``kv``: the sequence's keys and values at the microbatch)."""
    return kv / (tensor * context)


def ring_times(kv: np.ndarray, attention: np.ndarray, context: int, tensor: int, bandwidth: float, latency: float,
               call_latency: float, recompute: bool) -> np.ndarray:
    """Per unit and microbatch: the seconds one rank's ring adds to its attention, exposed past
    the blocks it overlaps (``attention``: per unit, the forward attention's seconds for the whole
    sequence on one device; its backward takes twice that)."""
    c = context
    if c <= 1:
        return np.zeros_like(kv)
    chunk = chunk_bytes(kv, c, tensor)
    hop = collective_time("send/recv", chunk, 2, bandwidth, latency, call_latency)
    block = attention / (tensor * c) / c  # one step's block of this rank's attention
    forward = (c - 1) * np.maximum(hop - block, 0.0)
    backward = (c - 1) * np.maximum(2 * hop - 2 * block, 0.0) + hop  # K/V and their gradients; the last hop home
    balance = collective_time("all-to-all", chunk, c, bandwidth, latency, call_latency)
    out = forward * (2 if recompute else 1) + backward + balance * (3 if recompute else 2)
    return np.where(kv > 0, out, 0.0)


def ring_in_flight(kv: np.ndarray, context: int, tensor: int) -> float:
    """Bytes the ring holds at once while the largest unit's attention runs (not kept after it)."""
    return float(np.max(IN_FLIGHT * chunk_bytes(kv, context, tensor), initial=0.0))


__all__ = ["IN_FLIGHT", "chunk_bytes", "ring_in_flight", "ring_times"]
