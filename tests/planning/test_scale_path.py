"""One planning path: where the flat exact search would exceed its budget (or refuses its tables)
the hierarchical search plans and the search line says so; repeated blocks solved once give the
plan the full search gives."""

from __future__ import annotations

import functools
import math

import pytest
import torch

import autopar
from autopar.core.blocks import apply_training, block_window, units
from autopar.core.strategy import TrainingOptions
from autopar.frontend.depth import trace_for_planning
from autopar.planning import budget
from autopar.planning import hierarchical as H
from autopar.planning.planner import run_search
from autopar.planning.whole import kept_whole
from autopar.search.common import SearchTooLargeError

CLUSTER = "8xH100"


def _llama(layers: int):
    import transformers as T

    from tests.helpers.hf_models import transformers_quiet

    transformers_quiet()
    cfg = T.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)
    with torch.device("meta"):
        model = T.LlamaForCausalLM(cfg)
        ids = torch.zeros(8, 16, dtype=torch.long)
    return model, dict(input_ids=ids, labels=ids)


@pytest.fixture(scope="module")
def llama4():
    model, inputs = _llama(4)
    return model, inputs, autopar.trace(model, inputs)


def test_within_budget_the_flat_search_plans(llama4):
    model, inputs, graph = llama4
    assert budget.over_budget(graph, autopar.Cluster.preset(CLUSTER)) == ""
    plan = autopar.plan(model, inputs, CLUSTER, graph=graph, baselines=False)
    assert plan.search.name != "hierarchical" and plan.search.path == ""


def test_over_budget_the_hierarchical_search_plans_and_says_why(llama4, monkeypatch):
    model, inputs, graph = llama4
    entries = budget.flat_entries(graph, autopar.Cluster.preset(CLUSTER))
    monkeypatch.setattr(budget, "FLAT_BUDGET", entries / 2)
    plan = autopar.plan(model, inputs, CLUSTER, graph=graph, baselines=False)
    assert plan.search.name == "hierarchical"
    line = plan.search.describe()
    assert "over its budget" in line and f"{entries:.2g}" in line
    assert plan.memory_per_device <= autopar.Cluster.preset(CLUSTER).memory_capacity
    assert plan.strategy.options.precision == "bf16"
    # asked for the flat search by name: no fallback
    flat = autopar.plan(model, inputs, CLUSTER, graph=graph, baselines=False, hierarchical=False)
    assert flat.search.name != "hierarchical"


def test_the_budget_counts_every_option_set_the_flat_search_may_run(llama4, monkeypatch):
    """Each training option set has its own tables and DP: tables within the budget once but not
    times the default sets go hierarchical; the same tables with one set asked for stay flat."""
    from autopar.planning.options import option_sets

    model, inputs, graph = llama4
    cluster = autopar.Cluster.preset(CLUSTER)
    entries = budget.flat_entries(graph, cluster)
    sets = len(option_sets(None, "auto", "auto", cluster=cluster, mode="train", accumulate="auto"))
    assert sets > 2
    monkeypatch.setattr(budget, "FLAT_BUDGET", entries * 2)
    plan = autopar.plan(model, inputs, CLUSTER, graph=graph, baselines=False)
    assert plan.search.name == "hierarchical"
    assert f"for each of {sets} training option sets" in plan.search.describe()
    one = autopar.plan(model, inputs, CLUSTER, graph=graph, baselines=False, zero=0, recompute=False, accumulate=1)
    assert one.search.name != "hierarchical"


def test_the_flat_search_keeps_only_the_best_and_the_plain_sets_tables(llama4, monkeypatch):
    """A beaten option set's tables are dropped as the search goes (on a large mesh each set's are
    gigabytes), and the plan is the one the search keeping every set's tables finds."""
    from autopar.core.margin import device_memory_for
    from autopar.cost_models.analytic import AnalyticModel
    from autopar.planning.options import FlatOptions, option_sets
    from autopar.search.dp import dp

    model, inputs, graph = llama4
    cluster = autopar.Cluster.preset(CLUSTER)
    cm = AnalyticModel()
    sets = [o for o in option_sets("bf16", "auto", "auto", cluster=cluster, accumulate=1)
            if o.zero <= 1 and o.every == 1 and o.recompute in (False, True)]  # 4 sets: a quick test
    searched, limits = [], []

    def run(t, limit):  # the exact DP without its ILP finish: the same plan every run
        searched.append(t)
        limits.append(limit)
        return dp(t, ilp_fallback=False, max_multipliers=8)

    _, _, _, plain = FlatOptions(graph, cluster, cm, "train", "adam", None, sets[:1]).solve(run, 20.0)
    tight = device_memory_for(0.6 * plain.memory)  # usable: below the plain set's best plan's
    searched.clear()
    limits.clear()
    flat = FlatOptions(graph, cluster, cm, "train", "adam", tight, sets)
    opts, _, _, sol = flat.solve(run, 20.0)
    assert len(searched) >= 3  # memory binds: several sets searched
    assert set(flat._tables) <= {sets[0], opts}
    # the sets share the time limit: the first search gets its share, none the whole
    assert limits[0] <= 20.0 / len(sets) + 1e-6 and max(limits) < 20.0
    monkeypatch.setattr(FlatOptions, "_forget", lambda self, o: None)
    keep = FlatOptions(graph, cluster, cm, "train", "adam", tight, sets)
    opts_kept, _, _, sol_kept = keep.solve(run, 20.0)
    assert len(keep._tables) >= 3
    assert (opts_kept, sol_kept.cost, sol_kept.choice) == (opts, sol.cost, sol.choice)


def test_tables_too_large_for_the_dp_fall_back_not_raise(llama4, monkeypatch):
    """The flat DP refuses its tables (SearchTooLargeError, its real check, with a budget of
    1 KiB for tables priced against a device's memory: the flat search's; the hierarchical
    search's tensor-group tables have no capacity and keep the default budget)."""
    import importlib

    dp_module = importlib.import_module("autopar.search.dp")

    model, inputs, graph = llama4
    real = dp_module.dp

    def small(tables, *args, **kwargs):
        if math.isfinite(tables.memory_capacity):
            kwargs["memory_budget"] = 1024
        return real(tables, *args, **kwargs)

    monkeypatch.setattr(dp_module, "dp", small)
    with pytest.raises(SearchTooLargeError):
        autopar.plan(model, inputs, CLUSTER, graph=graph, baselines=False, search="dp", hierarchical=False)
    plan = autopar.plan(model, inputs, CLUSTER, graph=graph, baselines=False, search="dp")
    assert plan.search.name == "hierarchical"
    assert "the flat exact search stopped (the exact DP needs" in plan.search.describe()


def test_the_deepened_graph_plans_as_the_full_trace():
    model, inputs = _llama(6)
    full = autopar.plan(model, inputs, CLUSTER, graph=autopar.trace(model, inputs), baselines=False)
    short = autopar.plan(model, inputs, CLUSTER, baselines=False)  # traces 4 of the 6 layers
    assert short.graph.fx_graph is None
    assert short.assignment == full.assignment
    assert short.cost == pytest.approx(full.cost, rel=1e-12)
    assert short.memory_per_device == pytest.approx(full.memory_per_device, rel=1e-12)


def test_blocks_solved_once_give_the_full_searchs_plan():
    """The hierarchical search on a 6-layer Llama: its tensor groups solved on the 3-block window
    (every middle layer takes the window's middle layer's layout) and on the whole graph give
    the same best candidate, cost and layouts."""
    model, inputs = _llama(6)
    graph = trace_for_planning(model, inputs)
    cluster = autopar.Cluster.preset(CLUSTER)
    solve = functools.partial(_solve, frozenset(kept_whole(graph)))  # as the planner: from the whole graph
    runs = []
    for window in (True, False):
        s = H.Search(graph, cluster, "bf16", "adam", "train", cluster.memory_capacity * 0.9, solve)
        if not window:
            s._windows = {False: None, True: None}
        best, _, _, _ = s.best(None, (0, 1), (False, True))
        stats = s.stats(best.candidate)
        runs.append((best.candidate, best.cost, H.assignment_of(best, stats, s.training_graph(best.candidate.recompute))))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] == pytest.approx(runs[1][1], rel=1e-9)
    assert runs[0][2] == runs[1][2]


def test_a_deepened_decoders_layers_give_the_window_of_three():
    """Exported Hugging Face layers each hold a weight view named for the layer's own parameter
    (``attrs["weight_view"]``); the layers are still one block repeated, so the hierarchical
    search solves its tensor groups on the 3-block window, not on every layer."""
    model, inputs = _llama(8)
    graph = apply_training(trace_for_planning(model, inputs), TrainingOptions(precision="bf16"))
    assert any("weight_view" in n.attrs for n in graph.nodes)
    window = block_window(graph)
    assert window is not None
    assert len(units(window.graph)) == len(units(graph)) - 5  # 8 layers -> 3


def test_the_search_closes_before_its_time_limit_and_a_larger_limit_changes_nothing():
    """A deepened 8-layer Llama on 64 devices (16 nodes of 4): the branch and bound closes (its
    next bound reaches the best plan) within the planner's default limit, on tensor groups solved
    on the 3-block window, and without any limit it ends at the same candidate and cost."""
    import time

    model, inputs = _llama(8)
    model_inputs = dict(inputs, input_ids=torch.zeros(32, 16, dtype=torch.long))
    model_inputs["labels"] = model_inputs["input_ids"]
    graph = trace_for_planning(model, model_inputs)
    cluster = autopar.Cluster.preset("16x4xH100")
    solve = functools.partial(_solve, frozenset(kept_whole(graph)))
    runs = []
    for deadline in (time.process_time() + 60.0, None):
        s = H.Search(graph, cluster, "bf16", "adam", "train", cluster.memory_capacity * 0.9, solve, max_tensor=8)
        best, _, priced, closed = s.best(None, (0, 1, 2, 3), (False, True), deadline, tuple(H.SCHEDULES))
        assert closed and priced > 0
        assert all(len(st.graph.nodes) < len(graph.nodes) for st in s._memo.values())  # the window's
        runs.append((best.candidate, best.cost))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] == pytest.approx(runs[1][1], rel=1e-12)


def _solve(whole, tables, graph=None):
    return run_search(tables, "dp", 60.0, whole, graph, "auto")


FACTORY = '''
import torch, transformers


def deep(layers=8):
    transformers.logging.set_verbosity_error()
    cfg = transformers.LlamaConfig(num_hidden_layers=layers, hidden_size=64, intermediate_size=128,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   max_position_embeddings=64)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
        ids = torch.zeros(64, 16, dtype=torch.long)
    return model, dict(input_ids=ids, labels=ids)
'''


def test_the_command_line_plans_a_model_file_of_a_deep_decoder_on_1024_devices(tmp_path):
    """`autopar plan file.py:factory --cluster 128x8xH100`: keyword inputs from the factory, the
    layers traced once (the plan file's graph has all 8 layers), a mixed-precision plan that fits."""
    import json

    from autopar.cli import main

    (tmp_path / "deep.py").write_text(FACTORY)
    out = tmp_path / "plan.json"
    assert main(["plan", f"{tmp_path / 'deep.py'}:deep", "--cluster", "128x8xH100", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["search"]["name"] == "hierarchical"
    assert doc["memory_per_device"] <= autopar.Cluster.preset("128x8xH100").memory_capacity
    assert "bf16" in json.dumps(doc["strategy"])
    import importlib.util

    spec = importlib.util.spec_from_file_location("deep", tmp_path / "deep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, inputs = module.deep()
    assert sorted(doc["assignment"]) == sorted(n.name for n in autopar.trace(model, inputs).nodes)


def test_the_hierarchical_searchs_time_limit_counts_its_own_cpu_seconds(monkeypatch):
    """A machine busy with other work (the wall clock racing ahead of the process's CPU time) does
    not cut the search short: with every wall-clock reading 1000 s after the last, it still closes."""
    import time as real_time
    import types

    clock = {"t": real_time.perf_counter()}

    def racing():
        clock["t"] += 1000.0
        return clock["t"]

    fake = types.SimpleNamespace(perf_counter=racing, process_time=real_time.process_time)
    monkeypatch.setattr(H, "time", fake)
    model, inputs = autopar.zoo.get("gpt", layers=2, width=64, heads=4, seq=32, batch=16, vocab=256, device="meta")
    plan = autopar.plan(model, inputs, "2x8xH100", hierarchical=True, baselines=False, time_limit=60.0)
    assert plan.search.status == "bound", plan.search.describe()
