"""CostTables.total and restrict agree with a direct evaluation."""

import itertools

import numpy as np
import pytest

from autopar.core.tables import Config, CostTables, restrict


def random_tables(rng, sizes=(3, 2, 4), edges=((0, 1), (1, 2), (0, 2))):
    return CostTables(
        nodes=[f"n{i}" for i in range(len(sizes))],
        configs=[[Config((c,)) for c in range(k)] for k in sizes],
        node_cost=[rng.random(k) for k in sizes],
        edge_cost={(u, v): rng.random((sizes[u], sizes[v])) for u, v in edges},
        memory=[rng.random(k) for k in sizes],
        memory_capacity=2.0,
    )


def test_restricted_totals_equal_original_totals_of_mapped_choices():
    rng = np.random.default_rng(0)
    t = random_tables(rng)
    keep = [[2, 0], [1], [3, 1, 0]]
    r = restrict(t, keep)
    assert [len(c) for c in r.configs] == [2, 1, 3]
    for choice in itertools.product(*(range(len(k)) for k in keep)):
        mapped = [keep[i][c] for i, c in enumerate(choice)]
        assert r.total(choice) == pytest.approx(t.total(mapped))
        assert r.total_memory(choice) == pytest.approx(t.total_memory(mapped))
        assert r.configs[0][choice[0]] == t.configs[0][mapped[0]]


def test_total_is_sum_of_node_and_edge_terms():
    rng = np.random.default_rng(1)
    t = random_tables(rng)
    choice = (1, 0, 2)
    expect = t.node_cost[0][1] + t.node_cost[1][0] + t.node_cost[2][2]
    expect += t.edge_cost[(0, 1)][1, 0] + t.edge_cost[(1, 2)][0, 2] + t.edge_cost[(0, 2)][1, 2]
    assert t.total(choice) == pytest.approx(expect)


def test_empty_restriction_names_the_node():
    t = random_tables(np.random.default_rng(2))
    with pytest.raises(ValueError, match="n1"):
        restrict(t, [[0], [], [0]])
