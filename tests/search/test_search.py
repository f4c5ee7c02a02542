"""Unit tests of the exact searches: the kernel, the orders, reuse of repeated blocks, memory.

The property tests (test_search_properties.py) compare dp, ilp and brute on random small graphs;
these pin down the pieces and the cases random graphs rarely hit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from autopar.core.errors import InfeasibleError
from autopar.search import SearchTooLargeError, brute, dp, dp_plan, ilp
from autopar.search.elimination import _intern
from autopar.search.minplus import best_config, eliminate
from autopar.search.order import adjacency, min_fill_order, min_weight_order, pase_order
from autopar.core.tables import Config, CostTables


def make(node_cost, edge_cost, memory=(), capacity=math.inf) -> CostTables:
    node_cost = [np.asarray(c, dtype=float) for c in node_cost]
    return CostTables(nodes=[f"n{i}" for i in range(len(node_cost))],
                      configs=[[Config((c,)) for c in range(len(v))] for v in node_cost],
                      node_cost=node_cost,
                      edge_cost={e: np.asarray(m, dtype=float) for e, m in edge_cost.items()},
                      memory=[np.asarray(m, dtype=float) for m in memory],
                      memory_capacity=capacity)


def repeated_blocks(blocks: int, k: int, seed: int = 0, perturb: int | None = None) -> CostTables:
    """A shared input node 0, then ``blocks`` identical 4-node blocks: x -> a -> (b, c) -> y,
    with a residual x -> y and every b also reading node 0 (like a decoder reading the encoder).
    ``perturb``: change one edge entry in that block, which must defeat reuse there."""
    rng = np.random.default_rng(seed)
    shape_a = rng.integers(0, 50, k).astype(float)
    unary = [rng.integers(0, 50, k).astype(float) for _ in range(4)]
    pair = {name: rng.integers(0, 50, (k, k)).astype(float)
            for name in ("xa", "ab", "ac", "by", "cy", "xy", "0b")}
    node_cost = [shape_a]
    edges: dict[tuple[int, int], np.ndarray] = {}
    x = 0
    for blk in range(blocks):
        a, b, c, y = (len(node_cost) + i for i in range(4))
        node_cost += [u.copy() for u in unary]
        for (s, t), name in {(x, a): "xa", (a, b): "ab", (a, c): "ac", (b, y): "by",
                             (c, y): "cy", (x, y): "xy", (0, b): "0b"}.items():
            m = pair[name].copy()
            if (s, t) in edges:
                m = m + edges[(s, t)]
            edges[(s, t)] = m
        if blk == perturb:
            edges[(a, c)][0, 0] += 7.0
        x = y
    return make(node_cost, edges)


# --- the kernel -------------------------------------------------------------------------------

def _naive(factors, v, out_scope, sizes):
    full = tuple(out_scope) + (v,)
    total = np.zeros([sizes[w] for w in full])
    for table, scope in factors:
        perm = [scope.index(w) for w in full if w in scope]
        shape = [sizes[w] if w in scope else 1 for w in full]
        total = total + table.transpose(perm).reshape(shape)
    return total.min(axis=-1)


@pytest.mark.parametrize("kv", [3, 40])  # the small-domain loop and the tiled reduction
def test_eliminate_matches_naive_sum(kv):
    rng = np.random.default_rng(1)
    sizes = {0: kv, 1: 5, 2: 7, 3: 6}
    factors = [(rng.random((kv,)), (0,)), (rng.random((5, kv)), (1, 0)),
               (rng.random((kv, 7, 6)), (0, 2, 3)), (rng.random((6, 5, kv)), (3, 1, 0)),
               (rng.random((7,)), (2,))]
    factors = [f for f in factors if 0 in f[1]]
    out_scope = (2, 1, 3)
    want = _naive(factors, 0, out_scope, sizes)
    assert np.allclose(eliminate(factors, 0, out_scope), want, rtol=0, atol=1e-12)
    # A tiny scratch forces the chunked and the row-by-row paths.
    for scratch in (np.empty(kv * 6 * 2), np.empty(kv)):
        assert np.allclose(eliminate(factors, 0, out_scope, scratch), want, rtol=0, atol=1e-12)


def test_eliminate_leaves_inputs_untouched_and_reduces_to_a_scalar():
    a, b = np.arange(4.0), np.arange(4.0)[::-1].copy()
    out = eliminate([(a, (0,)), (b, (0,))], 0, ())
    assert out.shape == () and float(out) == 3.0
    assert np.array_equal(a, np.arange(4.0)) and np.array_equal(b, [3.0, 2.0, 1.0, 0.0])


def test_best_config_picks_lowest_index_on_ties():
    assert best_config([(np.array([[2.0, 1.0, 1.0]]), (5, 0))], 0, {5: 0}, 3) == 1


def test_intern_compares_whole_tables_not_samples():
    a = np.zeros(1024)
    b = a.copy()
    b[1] = 1.0  # off the sampled positions
    assert _intern([a, a.copy(), b]) == [0, 0, 1]


# --- orders -----------------------------------------------------------------------------------

def test_pase_order_is_generateseq():
    assert pase_order(adjacency(3, [(0, 1), (1, 2)])) == [0, 1, 2]
    assert pase_order(adjacency(4, [(0, 1), (0, 2), (0, 3)])) == [1, 2, 0, 3]
    # A diamond 0 -> {1, 2} -> 3: every vertex has 2 neighbours; ties by index, sets merge.
    assert pase_order(adjacency(4, [(0, 1), (0, 2), (1, 3), (2, 3)])) == [0, 1, 2, 3]


def test_size_aware_orders_avoid_big_nodes():
    sizes = (1000, 2, 2)
    adj = adjacency(3, [(0, 1), (0, 2)])
    assert min_weight_order(adj, sizes)[0] != 0
    assert sorted(min_fill_order(adj, sizes)) == [0, 1, 2]


# --- the DP -----------------------------------------------------------------------------------

@pytest.mark.parametrize("order", ["auto", "pase", "min_weight", "min_fill"])
def test_dp_matches_brute_on_a_diamond_with_a_skip(order):
    rng = np.random.default_rng(3)
    sizes = [3, 4, 2, 3, 4]
    edges = {(0, 1): None, (0, 2): None, (1, 3): None, (2, 3): None, (0, 4): None, (3, 4): None}
    t = make([rng.random(k) for k in sizes],
             {(u, v): rng.random((sizes[u], sizes[v])) for u, v in edges})
    ref, sol = brute(t), dp(t, order=order)
    assert sol.gap == 0.0 and math.isclose(sol.cost, ref.cost, rel_tol=1e-12)


def test_dp_handles_isolated_nodes_and_single_configs():
    t = make([[5.0, 1.0], [2.0], [4.0, 3.0, 9.0]], {(1, 2): [[0.0, 5.0, 0.0]]})
    sol = dp(t)
    assert sol.choice == [1, 0, 0] and sol.cost == 7.0


def test_repeated_blocks_reuse_is_exact_and_saves_work():
    t = repeated_blocks(blocks=8, k=12)
    on, off = dp(t, reuse=True), dp(t, reuse=False)
    assert on.cost == off.cost
    assert t.total(on.choice) == t.total(off.choice) == on.cost
    plan = dp_plan(t, reuse=True)
    assert plan.reused_steps > 0 and plan.work < plan.work_without_reuse
    assert dp_plan(t, reuse=False).reused_steps == 0


def test_repeated_blocks_match_brute():
    t = repeated_blocks(blocks=3, k=3)  # 13 nodes, 3^13 assignments: too many, so shrink:
    t = repeated_blocks(blocks=2, k=3)  # 9 nodes, 19683 assignments
    assert math.isclose(dp(t).cost, brute(t).cost, rel_tol=1e-12)


def test_a_block_that_differs_is_not_reused():
    t = repeated_blocks(blocks=2, k=3, perturb=1)
    assert math.isclose(dp(t, reuse=True).cost, brute(t).cost, rel_tol=1e-12)
    big = repeated_blocks(blocks=6, k=8, perturb=3)
    assert dp(big, reuse=True).cost == dp(big, reuse=False).cost
    plan_same = dp_plan(repeated_blocks(blocks=6, k=8))
    plan_diff = dp_plan(big)
    assert plan_diff.reused_steps < plan_same.reused_steps


def test_dp_refuses_tables_over_its_memory_budget():
    t = repeated_blocks(blocks=2, k=12)
    with pytest.raises(SearchTooLargeError, match="budget"):
        dp(t, memory_budget=1000)


def test_brute_refuses_too_many_assignments():
    t = make([np.zeros(10)] * 7, {})
    with pytest.raises(ValueError):
        brute(t)


def test_ilp_refuses_too_many_variables():
    t = repeated_blocks(blocks=2, k=12)
    with pytest.raises(SearchTooLargeError):
        ilp(t, max_variables=100)


def test_ilp_matches_dp_on_repeated_blocks():
    t = repeated_blocks(blocks=3, k=6)
    sol, ref = ilp(t), dp(t)
    assert sol.gap == 0.0 and math.isclose(sol.cost, ref.cost, rel_tol=1e-9)


# --- the memory limit -------------------------------------------------------------------------

def knapsack() -> CostTables:
    """Three independent nodes: config 0 is free but uses memory 6/5/5, config 1 costs 7/5/5 and
    uses none; capacity 10. Optimum 7 (keep the two 5s); the Lagrangian (= LP) bound is 6."""
    return make([[0.0, 7.0], [0.0, 5.0], [0.0, 5.0]], {},
                memory=[[6.0, 0.0], [5.0, 0.0], [5.0, 0.0]], capacity=10.0)


def test_memory_duality_gap_is_closed_by_the_ilp():
    t = knapsack()
    sol = dp(t)
    assert (sol.cost, sol.gap, sol.search, sol.choice) == (7.0, 0.0, "dp+ilp", [1, 0, 0])
    assert brute(t).cost == ilp(t).cost == 7.0


def test_memory_duality_gap_is_reported_without_the_ilp():
    sol = dp(knapsack(), ilp_fallback=False)
    assert sol.memory <= 10.0 and sol.cost >= 7.0
    assert sol.gap > 0.0 and sol.cost * (1 - sol.gap) <= 7.0 + 1e-12


def test_memory_limit_closed_by_the_lagrangian_alone():
    # Node 0's (memory, cost) points (10, 0), (6, 2), (2, 5) are convex: the multiplier that
    # prices memory at 0.5..0.75 per unit picks (6, 2), which fits, and the bounds meet.
    t = make([[0.0, 2.0, 5.0], [1.0, 0.0]], {(0, 1): [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]},
             memory=[[10.0, 6.0, 2.0], [0.0, 0.0]], capacity=6.0)
    sol = dp(t)
    assert (sol.cost, sol.gap, sol.search) == (brute(t).cost, 0.0, "dp")


def test_infeasible_memory_raises_the_same_error_everywhere():
    t = make([[1.0, 2.0], [1.0]], {(0, 1): [[0.0], [1.0]]},
             memory=[[4.0, 3.0], [2.0]], capacity=4.0)
    for search in (brute, dp, ilp):
        with pytest.raises(InfeasibleError) as err:
            search(t)
        assert err.value.min_memory_per_device == 5.0


def test_unconstrained_optimum_that_fits_is_returned_directly():
    t = make([[0.0, 1.0]], {}, memory=[[3.0, 1.0]], capacity=3.0)
    sol = dp(t)
    assert (sol.choice, sol.cost, sol.gap, sol.search) == ([0], 0.0, 0.0, "dp")


# --- PaSE's published optima (docs/pase.md §8), through its cost model's tables ----------

@pytest.mark.parametrize("model,batch,kappa,p,total", [
    ("alexnet", 128, 4, 4, 148215719552), ("alexnet", 128, 4, 64, 41120456048),
    ("rnnlm", 64, 1, 4, 6866837733376), ("rnnlm", 64, 1, 64, 935818633216)])
def test_dp_reproduces_pase_published_optima(model, batch, kappa, p, total):
    from autopar.pase import model as pase
    from autopar.pase import reference as graphs
    tables = pase.pase_tables(getattr(graphs, f"{model}_graph")(batch), p, kappa)
    assert math.isclose(dp(tables).cost, total, rel_tol=1e-9)


def test_reuse_order_eliminates_block_interiors_first():
    t = repeated_blocks(blocks=8, k=6)
    reuse, greedy = dp_plan(t, order="reuse"), dp_plan(t, order="min_weight")
    assert reuse.work <= greedy.work and reuse.reused_steps >= greedy.reused_steps
    assert dp(t, order="reuse").cost == dp(t, order="min_weight", reuse=False).cost


def dense(n: int, k: int, seed: int) -> CostTables:
    """Every pair of ``n`` nodes joined by a random ``k``x``k`` edge: the LP relaxation is far from
    integral, so HiGHS's first plan is not the optimum."""
    rng = np.random.default_rng(seed)
    return make([rng.integers(0, 20, k) for _ in range(n)],
                {(i, j): rng.integers(0, 50, (k, k)) for i in range(n) for j in range(i + 1, n)})


@pytest.mark.parametrize("n,k,seed", [(6, 4, 0), (8, 4, 1), (10, 3, 2)])
def test_ilp_stopped_before_the_optimum_gives_a_plan_with_an_honest_gap(n, k, seed):
    # Stopped at its first plan (a solution limit: the same plan on every run, where a time
    # limit depends on the machine), the ILP returns a worse plan than the optimum, and its gap
    # must cover the difference: gap = (cost - proven bound) / cost and bound <= optimum, so
    # gap >= (cost - optimum) / cost. An ILP that reported gap 0 for a plan it did not prove fails.
    t = dense(n, k, seed)
    best = dp(t).cost
    assert best == pytest.approx(brute(t).cost, rel=1e-12)
    sol = ilp(t, solution_limit=1)
    assert sol.cost == pytest.approx(t.total(sol.choice), rel=1e-12)
    assert sol.cost > best * (1 + 1e-6)  # stopped early: the case this test is for
    assert sol.gap >= (sol.cost - best) / sol.cost - 1e-9
    assert sol.gap < 1.0  # and the bound says something
    full = ilp(t)
    assert (full.cost, full.gap) == (pytest.approx(best, rel=1e-9), 0.0)


def test_least_memory_plan_ruled_out_by_cost_still_finds_the_fitting_one():
    # Config 1 of node 0 needs the least memory but the cost model rules it out (inf); the
    # fitting plans of finite cost need node 1 to give up memory instead.
    t = make([[0.0, np.inf, 3.0], [0.0, 4.0]], {(0, 1): [[0.0, 1.0], [0.0, 0.0], [2.0, 0.0]]},
             memory=[[5.0, 1.0, 3.0], [4.0, 1.0]], capacity=6.0)
    ref = brute(t)
    assert ref.cost == 5.0
    for sol in (dp(t), ilp(t)):
        assert (sol.cost, sol.gap) == (5.0, 0.0) and sol.memory <= 6.0
    alone = dp(t, ilp_fallback=False)
    assert alone.memory <= 6.0 and alone.cost * (1 - alone.gap) <= 5.0 + 1e-12


def test_no_finite_plan_that_fits_raises_everywhere():
    # The least memory (2) fits only through the ruled-out config: the DP's multipliers reach
    # their limit and the least-memory DP settles it.
    t = make([[0.0, np.inf], [0.0]], {}, memory=[[5.0, 1.0], [1.0]], capacity=3.0)
    for search in (brute, dp, ilp):
        with pytest.raises(InfeasibleError):
            search(t)
