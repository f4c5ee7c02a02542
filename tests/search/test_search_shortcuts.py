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


# --- pipeline options pruned by their lower bound (planning/stages.py) ------------------------------

@pytest.fixture(scope="module")
def small_gpt():
    import autopar

    model, inputs = autopar.zoo.get("gpt", layers=4, width=1024, heads=8, seq=512, batch=32, vocab=4096,
                                    device="meta")
    return autopar.trace(model, inputs)


def _pipeline_setup(graph, cluster):
    from autopar.cost_models.analytic import AnalyticModel
    from autopar.planning.planner import run_search

    return dict(graph=graph, cluster=cluster, mode="train", optimizer="adam", capacity=math.inf,
                solve=lambda t, g=None: run_search(t, "dp", 60.0), model=AnalyticModel(optimizer="adam"))


def _clusters():
    import dataclasses

    import autopar

    fast = autopar.Cluster.preset("4x2xH100")
    return [fast, dataclasses.replace(fast, inter_bandwidth=2e8, name="slow-ib")]


@pytest.mark.parametrize("which", [0, 1])
def test_step_lower_bound_is_below_every_option_s_best_pipeline(small_gpt, which):
    from autopar.planning import stages
    from autopar.search.pipeline import search

    kw = _pipeline_setup(small_gpt, _clusters()[which])
    options = stages.price_options(kw["graph"], kw["cluster"], kw["mode"], kw["optimizer"], kw["solve"], kw["model"])
    assert len(options) >= 4
    for o in options:
        best = search([o.costs], kw["cluster"].devices)
        s = kw["cluster"].devices // o.costs.devices
        bound = stages.step_lower_bound(o.graph, kw["cluster"], s, o.costs.microbatches, "train", kw["model"])
        assert 0 < bound <= best.cost * (1 + 1e-12)


@pytest.mark.parametrize("which", [0, 1])
def test_pruned_pipeline_search_equals_the_unpruned_one(small_gpt, which, monkeypatch):
    from autopar.planning import stages
    from autopar.planning.planner import plan

    kw = _pipeline_setup(small_gpt, _clusters()[which])
    full = stages.best_pipeline(**kw, prune=False)
    assert full is not None
    single = plan(None, cluster=kw["cluster"], graph=small_gpt, pipeline=False, baselines=False).cost
    priced = []
    real = stages.price_option
    monkeypatch.setattr(stages, "price_option", lambda *a, **k: priced.append(a[2:5]) or real(*a, **k))
    for bound in (math.inf, single, full[0].cost, full[0].cost * 0.5):
        priced.clear()
        pruned = stages.best_pipeline(**kw, bound=bound)
        if full[0].cost < bound or bound == math.inf:  # the caller would take it: the very same
            assert pruned is not None
            a, b = pruned[0], full[0]
            assert (a.cost, a.stages, a.devices, a.microbatches, a.schedule) == \
                   (b.cost, b.stages, b.devices, b.microbatches, b.schedule)
        else:  # the caller keeps its single-stage plan: nothing cheaper than the bound is missed
            assert pruned is None or pruned[0].cost >= bound
    if which == 0:  # compute-heavy enough that the bound prunes (so the equality is about pruning)
        priced.clear()
        stages.best_pipeline(**kw, bound=single)
        assert len(priced) < len(stages.option_specs(small_gpt, kw["cluster"]))
