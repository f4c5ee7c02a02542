"""Property tests: dp, ilp and brute agree on random small graphs, with and without a memory limit.

Graphs: up to 8 nodes, up to 4 configs each, any set of edges u < v (chains, diamonds, several
parents, disconnected parts), non-negative integer-valued costs (so ties are exact and the
comparisons need no tolerance beyond float summation), integer memory and capacity.
Infeasible limits, and tables where every plan has an infinite cost, must raise InfeasibleError
from all three searches.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autopar.core.errors import InfeasibleError
from autopar.search import brute, dp, ilp
from autopar.core.tables import Config, CostTables

SETTINGS = settings(max_examples=100, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def tables(draw, with_memory: bool = False, scale: float = 1.0, inf_fraction: float = 0.0
           ) -> CostTables:
    n = draw(st.integers(1, 8))
    sizes = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    pairs = [(u, v) for v in range(n) for u in range(v)]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=len(pairs))) if pairs else []
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    node_cost = [rng.integers(0, 100, k) * scale for k in sizes]
    edge_cost = {e: rng.integers(0, 100, (sizes[e[0]], sizes[e[1]])) * scale for e in sorted(edges)}
    if inf_fraction:  # configs and pairs a cost model rules out are priced at inf
        for a in [*node_cost, *edge_cost.values()]:
            a[rng.random(a.shape) < inf_fraction] = np.inf
    memory, capacity = [], math.inf
    if with_memory:
        memory = [rng.integers(0, 20, k).astype(float) for k in sizes]
        lo = sum(int(m.min()) for m in memory)
        hi = sum(int(m.max()) for m in memory)
        if inf_fraction:
            for m in memory:
                m[rng.random(m.shape) < inf_fraction] = np.inf
        capacity = float(draw(st.integers(max(0, lo - 3), hi)))
    return CostTables(nodes=[f"n{i}" for i in range(n)],
                      configs=[[Config((c,)) for c in range(k)] for k in sizes],
                      node_cost=node_cost, edge_cost=edge_cost, memory=memory,
                      memory_capacity=capacity)


def _agree(t: CostTables, rel: float = 1e-9) -> None:
    try:
        ref = brute(t)
    except InfeasibleError:
        for search in (dp, ilp):
            with pytest.raises(InfeasibleError):
                search(t)
        return
    for sol in (dp(t), ilp(t)):
        assert sol.gap == 0.0, sol
        assert math.isclose(sol.cost, ref.cost, rel_tol=rel, abs_tol=1e-300), (sol, ref)
        assert math.isclose(t.total(sol.choice), sol.cost, rel_tol=1e-12, abs_tol=1e-300)
        assert sol.memory == t.total_memory(sol.choice)
        assert sol.memory <= t.memory_capacity * (1 + 1e-12)
        assert all(0 <= c < len(cfgs) for c, cfgs in zip(sol.choice, t.configs))


@SETTINGS
@given(tables())
def test_unconstrained_optimum_agrees(t):
    _agree(t)


@SETTINGS
@given(tables(with_memory=True))
def test_memory_limited_optimum_agrees(t):
    _agree(t)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(tables(scale=1e-7))
def test_tiny_units_agree(t):
    """Seconds-sized costs: the ILP's absolute tolerances must not blur the optimum."""
    _agree(t, rel=1e-7)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(tables(with_memory=True, scale=1e10))
def test_huge_units_agree(t):
    """PaSE's FLOP-equivalent units (~1e12 totals)."""
    _agree(t, rel=1e-7)


@SETTINGS
@given(tables(with_memory=True, inf_fraction=0.15))
def test_ruled_out_configs_agree(t):
    """inf entries: never chosen; every plan infinite (or over memory) is InfeasibleError."""
    _agree(t)


@SETTINGS
@given(tables(), st.sampled_from(["pase", "min_weight", "min_fill", "reuse"]), st.booleans())
def test_every_order_and_reuse_setting_is_exact(t, order, reuse):
    ref = brute(t)
    sol = dp(t, order=order, reuse=reuse)
    assert math.isclose(sol.cost, ref.cost, rel_tol=1e-9, abs_tol=1e-300)


@SETTINGS
@given(tables(with_memory=True))
def test_lagrangian_alone_reports_an_honest_gap(t):
    """Without the ILP the DP's memory loop may stop short, but its gap must bound the truth."""
    try:
        ref = brute(t)
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            dp(t, ilp_fallback=False)
        return
    sol = dp(t, ilp_fallback=False)
    assert sol.memory <= t.memory_capacity * (1 + 1e-12)
    assert sol.cost >= ref.cost * (1 - 1e-12)
    assert sol.cost * (1 - sol.gap) <= ref.cost * (1 + 1e-9) + 1e-9
    if sol.gap == 0.0:
        assert math.isclose(sol.cost, ref.cost, rel_tol=1e-9, abs_tol=1e-300)
