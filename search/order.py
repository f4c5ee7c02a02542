"""Elimination orders for the exact DP.

An order eliminates one node at a time; eliminating v joins its current neighbours d(v) into a
clique (the table built for v ranges over v and d(v)). Three greedy heuristics:

* ``pase``: PaSE's GENERATESEQ, the smallest |d(v)| first, ties by lowest node index.
* ``min_weight``: the smallest table first, i.e. the product of config counts over v and d(v); with
  config counts from 1 to 1000+ this follows the work the DP really does better than a degree does.
* ``min_fill``: the fewest new edges first (ties by table size, then index), which keeps later
  tables small on graphs with long-range edges (the Transformer's residuals, the decoder's
  shared encoder output).

A fourth, ``reuse`` (search/elimination.py), needs the factors' contents, not just the graph: it
amortises a step's work over the identical blocks that share it.

All break ties by node index, so blocks that repeat in index order are eliminated in the
same relative order, which is what lets the DP reuse the work of one block in the next.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator


def adjacency(n: int, edges: Iterable[tuple[int, int]]) -> list[set[int]]:
    adj: list[set[int]] = [set() for _ in range(n)]
    for u, v in edges:
        adj[u].add(v)
        adj[v].add(u)
    return adj


def _greedy_iter(adj: list[set[int]], score: Callable[[int, list[set[int]]], tuple]) -> Iterator[int]:
    """Eliminate the unsequenced vertex with the smallest ``(score, index)`` until none is left,
    yielding each as it is chosen (a caller that stops early skips the rest of the work).

    A heap of (score, vertex) entries, stale ones skipped when popped: the same order as taking
    ``min`` over all alive vertices at every step (scores only change for the vertices next to
    an eliminated one, which get a fresh entry), in O(n log n) instead of O(n^2) score lookups.
    """
    d = [set(s) for s in adj]
    alive = set(range(len(adj)))
    scores = {v: score(v, d) for v in alive}
    heap = [(s, v) for v, s in scores.items()]
    heapq.heapify(heap)
    while alive:
        s, v = heapq.heappop(heap)
        if v not in alive or scores[v] != s:
            continue  # eliminated already, or rescored since this entry was pushed
        yield v
        alive.remove(v)
        nbrs = d[v]
        touched = set(nbrs)
        for w in nbrs:
            d[w] |= nbrs
            d[w].discard(v)
            d[w].discard(w)
        for w in nbrs:
            touched |= d[w]
        touched &= alive
        for w in touched:
            new = score(w, d)
            if new != scores[w]:
                scores[w] = new
                heapq.heappush(heap, (new, w))
        d[v] = set()


def _pase_score(sizes):
    return lambda v, d: (len(d[v]),)


def _weight_score(sizes):
    return lambda v, d: (sizes[v] * math.prod(sizes[w] for w in d[v]),)


def _fill_score(sizes):
    def score(v: int, d: list[set[int]]) -> tuple:
        nb = d[v]
        # pairs of neighbours not yet adjacent; adjacency stays symmetric, so each missing pair
        # is seen from both ends: count them by set intersections, then halve
        k = len(nb)
        fill = sum(k - 1 - len(d[a] & nb) for a in nb) // 2
        return (fill, sizes[v] * math.prod(sizes[w] for w in nb))

    return score


def pase_order(adj: list[set[int]], sizes: tuple[int, ...] | None = None) -> list[int]:
    """GENERATESEQ: repeatedly the vertex with the smallest dependent set, merging sets."""
    return list(_greedy_iter(adj, _pase_score(sizes)))


def min_weight_order(adj: list[set[int]], sizes: tuple[int, ...]) -> list[int]:
    return list(_greedy_iter(adj, _weight_score(sizes)))


def min_fill_order(adj: list[set[int]], sizes: tuple[int, ...]) -> list[int]:
    return list(_greedy_iter(adj, _fill_score(sizes)))


def order_iter(name: str, adj: list[set[int]], sizes: tuple[int, ...]) -> Iterator[int]:
    """``ORDERS[name](adj, sizes)`` one vertex at a time."""
    return _greedy_iter(adj, _SCORES[name](sizes))


_SCORES = {"pase": _pase_score, "min_weight": _weight_score, "min_fill": _fill_score}

ORDERS: dict[str, Callable[[list[set[int]], tuple[int, ...]], list[int]]] = {
    "pase": pase_order,
    "min_weight": min_weight_order,
    "min_fill": min_fill_order,
}
