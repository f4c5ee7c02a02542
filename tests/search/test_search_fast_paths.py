"""The DP's fast paths give exactly what the plain ones give.

The elimination orders run on heaps (search/order.py) and per-key groups (``reuse_order``), and
``choose_plan`` stops walking a candidate order once it cannot be the least work. Each is checked
here against a plain O(n^2) reference written the obvious way (a ``min`` over every alive vertex at
every step; every candidate walked in full), on random graphs and on repeated blocks: same orders,
same chosen plan, same optimum.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from autopar.search import dp, dp_plan
from autopar.search.common import problem_of
from autopar.search.elimination import (REUSE_WORTH, TILE_ELEMENTS, _Symbolic, choose_plan, original_factors,
                                        plan, reuse_order)
from autopar.search.minplus import table_elements
from autopar.search.order import ORDERS, adjacency
from autopar.core.tables import Config, CostTables



def repeated_blocks(blocks: int, k: int, seed: int = 0) -> CostTables:
    """A shared input node 0, then ``blocks`` identical blocks x -> a -> (b, c) -> y with a
    residual x -> y and every b also reading node 0 (as in test_search.py)."""
    rng = np.random.default_rng(seed)
    unary = [rng.integers(0, 50, k).astype(float) for _ in range(5)]
    pair = {name: rng.integers(0, 50, (k, k)).astype(float)
            for name in ("xa", "ab", "ac", "by", "cy", "xy", "0b")}
    node_cost = [unary[4]]
    edges: dict[tuple[int, int], np.ndarray] = {}
    x = 0
    for _ in range(blocks):
        a, b, c, y = (len(node_cost) + i for i in range(4))
        node_cost += [u.copy() for u in unary[:4]]
        for (s, t), name in {(x, a): "xa", (a, b): "ab", (a, c): "ac", (b, y): "by",
                             (c, y): "cy", (x, y): "xy", (0, b): "0b"}.items():
            m = pair[name].copy()
            edges[(s, t)] = m + edges[(s, t)] if (s, t) in edges else m
        x = y
    return CostTables(nodes=[f"n{i}" for i in range(len(node_cost))],
                      configs=[[Config((c,)) for c in range(len(v))] for v in node_cost],
                      node_cost=node_cost, edge_cost=edges)


# --- the reference: the orders as first written -------------------------------------------------

def _greedy_ref(adj, score):
    d = [set(s) for s in adj]
    alive = set(range(len(adj)))
    order = []
    scores = {v: score(v, d) for v in alive}
    while alive:
        v = min(alive, key=lambda w: (scores[w], w))
        order.append(v)
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
            scores[w] = score(w, d)
        d[v] = set()
    return order


def _fill_score(sizes):
    def score(v, d):
        nb = list(d[v])
        fill = sum(1 for i, a in enumerate(nb) for b in nb[i + 1:] if b not in d[a])
        return (fill, sizes[v] * math.prod(sizes[w] for w in nb))
    return score


REFERENCE_ORDERS = {
    "pase": lambda adj, sizes: _greedy_ref(adj, lambda v, d: (len(d[v]),)),
    "min_weight": lambda adj, sizes: _greedy_ref(
        adj, lambda v, d: (sizes[v] * math.prod(sizes[w] for w in d[v]),)),
    "min_fill": lambda adj, sizes: _greedy_ref(adj, _fill_score(sizes)),
}


def _reuse_order_ref(p, factors, defer=1.0, ratio=2.0):
    state = _Symbolic(p, factors)
    alive = set(range(p.n))
    cache, sharing = {}, Counter()

    def refresh(v):
        if v in cache:
            sharing[cache[v][0]] -= 1
        key, _, out_scope = state.key(v)
        work = table_elements(p.sizes, out_scope) * p.sizes[v]
        if defer != 1.0 and p.sizes[v] > 1 and any(p.sizes[w] > ratio * p.sizes[v] for w in out_scope):
            work = work * defer
        cache[v] = (key, work)
        sharing[key] += 1

    def amortised(v):
        key, work = cache[v]
        return (0.0 if key in state.seen else work / sharing[key], v)

    for v in sorted(alive):
        refresh(v)
    order = []
    while alive:
        v = min(alive, key=amortised)
        sharing[cache.pop(v)[0]] -= 1
        step = state.eliminate(v, reuse=True)
        alive.remove(v)
        order.append(v)
        for w in step.out.scope:
            refresh(w)
    return order


def _choose_ref(p, factors, reuse=True, budget=1 << 30, worth=REUSE_WORTH):
    """Every candidate walked whole, then compared: the graph-only orders, and the reuse orders
    where no graph-only plan fits or the least fitting one's work is at least ``worth``."""
    adj = adjacency(p.n, p.edges.keys())

    def fits(pl):
        return pl.message_bytes + 8 * TILE_ELEMENTS <= budget and pl.widest < 60

    plans = [plan(p, factors, ORDERS[n](adj, p.sizes), n, reuse) for n in ORDERS]
    graph_only = [pl.work for pl in plans if fits(pl)]
    if reuse and (not graph_only or min(graph_only) >= worth):
        plans.append(plan(p, factors, _reuse_order_ref(p, factors), "reuse", reuse))
        plans.append(plan(p, factors, _reuse_order_ref(p, factors, 16.0, 2.0), "reuse_defer",
                          reuse))
    return min([pl for pl in plans if fits(pl)], key=lambda pl: (pl.work, pl.message_bytes))


# --- graphs -----------------------------------------------------------------------------------

def random_tables(seed: int, n: int = 30, k: int = 6, density: float = 0.12,
                  shared: bool = True) -> CostTables:
    """A random DAG; with ``shared``, nodes and edges draw their tables from a few templates, so
    equal factors (and reusable steps, and ties between orders) are common."""
    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(1, k + 1)) for _ in range(n)]
    if shared:
        sizes = [k if s > 1 else 1 for s in sizes]
    templates = {s: [rng.integers(0, 30, s).astype(float) for _ in range(3)] for s in set(sizes)}
    node_cost = [templates[s][int(rng.integers(0, 3))].copy() if shared else rng.random(s) for s in sizes]
    edges = {}
    for v in range(n):
        for u in range(v):
            if rng.random() < density or (u == v - 1 and rng.random() < 0.7):
                shape = (sizes[u], sizes[v])
                m = rng.integers(0, 4, shape).astype(float) if shared else rng.random(shape)
                edges[(u, v)] = m
    return CostTables(nodes=[f"n{i}" for i in range(n)],
                      configs=[[Config((c,)) for c in range(s)] for s in sizes],
                      node_cost=node_cost, edge_cost=edges)


CASES = ([("random", s) for s in range(12)] + [("random-distinct", s) for s in range(4)]
         + [("blocks", s) for s in range(4)])


def _case(kind: str, seed: int) -> CostTables:
    if kind == "random":
        return random_tables(seed, n=16 + 2 * seed, density=0.06)
    if kind == "random-distinct":
        return random_tables(seed, shared=False)
    return repeated_blocks(blocks=3 + 2 * seed, k=4 + seed, seed=seed)


@pytest.mark.parametrize("kind,seed", CASES)
def test_heap_orders_equal_the_plain_greedy(kind, seed):
    t = _case(kind, seed)
    p = problem_of(t)
    adj = adjacency(p.n, p.edges.keys())
    for name, ref in REFERENCE_ORDERS.items():
        assert ORDERS[name](adj, p.sizes) == ref(adj, p.sizes), name


@pytest.mark.parametrize("kind,seed", CASES)
def test_grouped_reuse_order_equals_the_plain_one(kind, seed):
    t = _case(kind, seed)
    p = problem_of(t)
    factors, _ = original_factors(p, p.node_cost)
    for defer, ratio in ((1.0, 2.0), (16.0, 2.0), (16.0, 1.0)):
        walked = []
        order = reuse_order(p, factors, walked, defer, ratio)
        assert order == _reuse_order_ref(p, factors, defer, ratio)
        # the steps it hands over are the steps a fresh walk of that order gives
        fresh = plan(p, factors, order, "reuse", True)
        assert [(s.v, s.out, s.reused, s.work) for s in walked] == [
            (s.v, s.out, s.reused, s.work) for s in fresh.steps]


@pytest.mark.parametrize("kind,seed", CASES)
def test_choose_plan_with_early_stops_picks_the_full_comparison_s_plan(kind, seed):
    t = _case(kind, seed)
    p = problem_of(t)
    factors, _ = original_factors(p, p.node_cost)
    for reuse, worth in ((True, REUSE_WORTH), (True, 0.0), (False, REUSE_WORTH)):
        got = choose_plan(p, factors, "auto", reuse, reuse_worth=worth)
        ref = _choose_ref(p, factors, reuse, worth=worth)
        assert (got.order_name, got.order, got.work, got.message_bytes) == (
            ref.order_name, ref.order, ref.work, ref.message_bytes)
    assert dp_plan(t).work == _choose_ref(p, factors).work


def test_a_walk_gives_up_only_above_its_bound():
    t = repeated_blocks(blocks=5, k=6)
    p = problem_of(t)
    factors, _ = original_factors(p, p.node_cost)
    order = ORDERS["pase"](adjacency(p.n, p.edges.keys()), p.sizes)
    full = plan(p, factors, order, "pase")
    assert plan(p, factors, order, "pase", give_up_above=full.work).work == full.work
    assert plan(p, factors, order, "pase", give_up_above=full.work - 1) is None


@pytest.mark.parametrize("defer", [1.0, 16.0])
def test_a_reuse_walk_gives_up_only_above_its_bound(defer):
    t = repeated_blocks(blocks=5, k=6)
    p = problem_of(t)
    factors, _ = original_factors(p, p.node_cost)
    order = reuse_order(p, factors, None, defer)
    work = plan(p, factors, order, "reuse").work
    assert work > 0
    walked: list = []
    assert reuse_order(p, factors, walked, defer, give_up_above=work) == order
    assert len(walked) == p.n
    assert reuse_order(p, factors, [], defer, give_up_above=work - 1) is None
    walked = []
    assert reuse_order(p, factors, walked, defer, give_up_above=work // 2) is None
    assert len(walked) < p.n  # it stopped as soon as the bound was passed, not at the end
    assert sum(s.work for s in walked if not s.reused) > work // 2
    assert sum(s.work for s in walked[:-1] if not s.reused) <= work // 2


@pytest.mark.parametrize("seed", range(6))
def test_dp_optimum_is_the_same_with_every_order(seed):
    t = random_tables(seed, n=14, k=4)
    costs = {dp(t, order=o, reuse=r).cost
             for o in ("auto", *ORDERS, "reuse", "reuse_defer") for r in (True, False)}
    assert max(costs) - min(costs) <= 1e-9 * max(1.0, abs(min(costs)))


def test_many_single_config_nodes_never_make_a_message_over_numpy_axes():
    # A restricted table (as the expert baseline makes): 90 nodes pinned to one config, each
    # next to a free node; deferring steps must not pile them into one message of > 64 axes.
    n = 92
    sizes = [1] * 90 + [3, 4]
    rng = np.random.default_rng(0)
    edges = {(i, 90): rng.random((1, 3)) for i in range(90)}
    edges.update({(i, i + 1): rng.random((1, 1)) for i in range(89)})
    edges[(90, 91)] = rng.random((3, 4))
    t = CostTables(nodes=[f"n{i}" for i in range(n)],
                   configs=[[Config((c,)) for c in range(s)] for s in sizes],
                   node_cost=[rng.random(s) for s in sizes], edge_cost=edges)
    assert dp_plan(t).widest < 60
    best = min(t.total([0] * 90 + [a, b]) for a in range(3) for b in range(4))
    assert math.isclose(dp(t).cost, best, rel_tol=1e-12)


# --- the mesh space, enumerated per class then combined --------------------------------------

def _mesh_configs_ref(dims, mesh):
    import itertools

    from autopar.core.space import axis_classes
    cands = [i for i, (size, ok) in enumerate(dims) if ok and size > 1]
    bins = len(cands) + 1
    per_class = [[(axes, combo) for combo in itertools.combinations_with_replacement(range(bins), len(axes))]
                 for axes in axis_classes(mesh)]
    out = []
    for choice in itertools.product(*per_class):
        assigned = [[] for _ in dims]
        for axes, combo in choice:
            for a, b in zip(axes, combo):
                if b:
                    assigned[cands[b - 1]].append(a)
        splits = tuple(math.prod(mesh.shape[a] for a in ax) for ax in assigned)
        if all(size % s == 0 for (size, _), s in zip(dims, splits)):
            out.append(Config(splits=splits, mesh_axes=tuple(tuple(sorted(ax)) for ax in assigned)))
    return out


@pytest.mark.parametrize("dims", [
    ((64, True), (1024, True), (16, True), (128, True)),
    ((8, True), (6, True), (3, False), (12, True)),
    ((2, True), (1, True), (5, True)),
    ((4, True), (6, True), (9, True), (2, False), (32, True)),
])
@pytest.mark.parametrize("mesh", [
    ((2,) * 6, (1, 1, 1, 0, 0, 0)), ((2, 2, 2), ()), ((2, 3), (1, 0)), ((), ()), ((5,), ()), ((3, 2, 2), (1, 0, 0)),
    ((2, 2, 2, 2), (1, 0, 1, 0)),
])
def test_mesh_configs_equal_the_plain_enumeration(dims, mesh):
    from autopar.core.space import _mesh_configs
    from autopar.core.tables import Mesh
    m = Mesh(*mesh)
    assert list(_mesh_configs.__wrapped__(dims, m)) == _mesh_configs_ref(dims, m)
