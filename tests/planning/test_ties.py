"""``planning.ties.prefer_data_parallel``: equal-cost optima moved toward data parallelism, the
cost and feasibility unchanged (brute force over every assignment is the reference)."""

from __future__ import annotations

import itertools

import numpy as np

from autopar.core.tables import Config, CostTables, Solution
from autopar.planning.ties import prefer_data_parallel


def _tables(node_cost, edges, memory=None):
    n = len(node_cost)
    configs = [[Config((k,), ((),)) for k in range(len(c))] for c in node_cost]
    return CostTables([f"n{i}" for i in range(n)], configs, [np.asarray(c, float) for c in node_cost],
                      {k: np.asarray(m, float) for k, m in edges.items()},
                      [np.asarray(m, float) for m in memory] if memory else [])


def _best(t):
    return min(itertools.product(*[range(len(c)) for c in t.configs]), key=t.total)


def _sol(t, choice):
    return Solution(list(choice), t.total(choice), t.total_memory(choice), "dp", 0.0)


def test_a_free_node_moves_to_its_data_parallel_config_and_the_cost_stays_optimal():
    # n1 is free either way (a view); n0 -> n1 -> n2 edges charge nothing for either of its configs
    t = _tables([[1.0, 0.5], [0.0, 0.0], [2.0, 1.0]],
                {(0, 1): [[0.0, 0.0], [0.0, 0.0]], (1, 2): [[0.0, 0.0], [0.0, 0.0]]})
    found = _sol(t, (1, 0, 1))  # an optimum: 1.5
    out = prefer_data_parallel(t, found, [1, 1, 1])
    assert out.choice == [1, 1, 1] and out.cost == t.total(_best(t)) == 1.5


def test_a_move_that_costs_anything_or_holds_more_memory_is_not_made():
    # n1's data-parallel config costs a reshard on its edge to n2
    t = _tables([[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]],
                {(0, 1): [[0.0, 0.0], [0.0, 0.0]], (1, 2): [[0.0, 0.0], [0.3, 0.3]]})
    assert prefer_data_parallel(t, _sol(t, (0, 0, 0)), [1, 1, 1]).choice == [1, 0, 1]
    # free, but the data-parallel config holds more bytes: kept (the plan must still fit)
    t = _tables([[0.0, 0.0]], {}, memory=[[1.0, 2.0]])
    sol = _sol(t, (0,))
    assert prefer_data_parallel(t, sol, [1]) is sol


def test_random_tables_keep_their_optimal_cost():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n, k = 4, 3
        # ties on purpose: costs drawn from a few values
        node = [rng.choice([0.0, 1.0], size=k) for _ in range(n)]
        edges = {(i, i + 1): rng.choice([0.0, 0.5], size=(k, k)) for i in range(n - 1)}
        t = _tables(node, edges, memory=[rng.choice([1.0, 2.0], size=k) for _ in range(n)])
        best = _best(t)
        dp = [int(x) for x in rng.integers(0, k, size=n)]
        out = prefer_data_parallel(t, _sol(t, best), dp)
        assert out.cost == t.total(best) and out.cost == t.total(out.choice)
        assert out.memory <= t.total_memory(best)
        assert all(c == best[i] or c == dp[i] for i, c in enumerate(out.choice))
