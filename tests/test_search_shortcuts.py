"""Shortcuts the planner takes instead of a second search, each checked against the search it skips.

``Solution.free_cost`` (the DP's optimum ignoring memory, found by its first solve) answers "does
memory bind?" (``planning/options.py``) without re-running the DP at infinite capacity.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from autopar.core.tables import Config, CostTables
from autopar.planning.options import FlatOptions
from autopar.search import brute, dp


def random_tables(seed: int, n: int = 6, k: int = 3) -> CostTables:
    """A chain with skip edges, random costs and memory."""
    rng = np.random.default_rng(seed)
    edges = {(i, i + 1): rng.integers(0, 20, (k, k)).astype(float) for i in range(n - 1)}
    edges.update({(i, i + 2): rng.integers(0, 20, (k, k)).astype(float) for i in range(0, n - 2, 2)})
    return CostTables(nodes=[f"n{i}" for i in range(n)], configs=[[Config((c,)) for c in range(k)]] * n,
                      node_cost=[rng.integers(0, 30, k).astype(float) for _ in range(n)], edge_cost=edges,
                      memory=[rng.integers(1, 10, k).astype(float) for _ in range(n)])


def _unlimited(t: CostTables) -> CostTables:
    return CostTables(t.nodes, t.configs, t.node_cost, t.edge_cost, t.memory, math.inf, t.units)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("cap_scale", [0.0, 0.6, 0.8, 1.0])
def test_free_cost_is_the_optimum_ignoring_memory(seed, cap_scale):
    t = random_tables(seed)
    unlimited = brute(_unlimited(t))
    least = sum(float(m.min()) for m in t.memory)
    t.memory_capacity = least + cap_scale * (unlimited.memory - least) if cap_scale else math.inf
    sol = dp(t, ilp_fallback=False)
    assert sol.free_cost == pytest.approx(unlimited.cost, rel=1e-12)
    # the shortcut and the second search agree on whether memory binds
    rerun = FlatOptions._binding(t, _without_free(sol), lambda tt: dp(tt, ilp_fallback=False))
    assert FlatOptions._binding(t, sol, None) == rerun
    assert rerun == (sol.cost > unlimited.cost * (1 + 1e-9))


def _without_free(sol):
    import dataclasses

    return dataclasses.replace(sol, free_cost=None)


def test_free_cost_unknown_when_configs_of_infinite_memory_are_priced_out():
    t = random_tables(3)
    t.memory[2] = t.memory[2].copy()
    t.memory[2][int(np.argmin(t.node_cost[2]))] = math.inf
    t.memory_capacity = 1e9
    sol = dp(t)
    assert sol.free_cost is None  # the DP never saw the optimum over all configs
    # so the planner searches again, and that search does see them
    assert FlatOptions._binding(t, sol, lambda tt: dp(tt)) == (brute(_unlimited(t)).cost < sol.cost * (1 - 1e-9))
