"""Values many layers read kept whole, and one-config nodes folded: exact where it says so."""

import itertools

import numpy as np
import pytest

import autopar
from autopar.core.tables import Config, CostTables
from autopar.planning.whole import fix_and_fold, kept_whole
from tests.helpers import hf_models


def _random_tables(seed: int) -> CostTables:
    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(1, 4)) for _ in range(6)]
    configs = [[Config(splits=(1,))] + [Config(splits=(2 + j,)) for j in range(k - 1)] for k in sizes]
    edges = {(u, v): rng.random((sizes[u], sizes[v])) for u in range(6) for v in range(u + 1, 6) if rng.random() < 0.5}
    return CostTables([f"n{i}" for i in range(6)], configs, [rng.random(k) for k in sizes], edges,
                      [rng.random(k) for k in sizes])


@pytest.mark.parametrize("seed", range(8))
def test_folding_one_config_nodes_keeps_every_cost(seed):
    tables = _random_tables(seed)
    folded = fix_and_fold(tables)
    assert all(len(folded.configs[i]) == len(c) for i, c in enumerate(tables.configs))
    assert not any(len(tables.configs[u]) == 1 or len(tables.configs[v]) == 1 for u, v in folded.edge_cost)
    for choice in itertools.product(*(range(len(c)) for c in tables.configs)):
        assert folded.total(choice) == pytest.approx(tables.total(choice))


@pytest.mark.parametrize("seed", range(8))
def test_fixing_nodes_is_the_restricted_problem(seed):
    tables = _random_tables(seed)
    fixed = {i: len(c) - 1 for i, c in enumerate(tables.configs) if i % 2 == 0}
    folded = fix_and_fold(tables, fixed)
    for choice in itertools.product(*(range(len(c)) for c in folded.configs)):
        full = [fixed.get(i, c) for i, c in enumerate(choice)]
        assert folded.total(choice) == pytest.approx(tables.total(full))
        assert folded.total_memory(choice) == pytest.approx(tables.total_memory(full))


def test_llama_keeps_its_mask_and_rotary_tables_whole():
    model, kwargs = hf_models.build("llama", layers=4)
    graph = autopar.trace(model, kwargs)
    whole = kept_whole(graph)
    sdpa = [n for n in graph.nodes if n.op == "sdpa"]
    assert {n.inputs[3].source for n in sdpa} <= whole  # the one mask all attentions read
    activations = {graph.nodes[0].name}  # the token embedding, and everything computed from it
    for n in graph.nodes:
        if any(o.source in activations for o in n.inputs):
            activations.add(n.name)
    assert graph.nodes[0].op == "embedding" and not whole & activations  # activations keep every split
    assert any(graph.node(n).module == "model.rotary_emb" for n in whole)  # cos/sin
    assert all(not graph.node(n).flops and not graph.node(n).params for n in whole)
    plan = autopar.plan(model, kwargs, autopar.Cluster(devices=4), graph=graph)
    assert plan.search.status == "optimal" and "values read by many layers" in plan.search.detail
    for name in whole:
        assert all(s == 1 for s in plan.assignment[name].splits)


def test_models_without_shared_values_plan_as_before():
    model, inputs = autopar.zoo.get("gpt", layers=3)
    assert kept_whole(autopar.trace(model, inputs)) == set()
