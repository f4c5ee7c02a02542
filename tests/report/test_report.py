"""plan.report() for pipelined, PaSE and profiled plans: the rows against numbers computed here.

Every expected number is computed in the test from the plan, its graph and the cost models'
own formulas, never copied from the report; numbers read back from the report's text are parsed
and compared to 3 significant digits (what the report prints).
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

import autopar
from autopar.core.batch import scale_batch
from autopar.core.sequence import sequence_dims
from autopar.cost_models.analytic import AnalyticModel
from autopar.cost_models.memory import already_saved, node_memory
from autopar.core.tables import Config

UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9,
         "B": 1.0, "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30}


def value(text: str) -> float:
    """'90.1 us' -> 9.01e-5; '0' -> 0."""
    text = text.strip()
    if text == "0":
        return 0.0
    num, unit = text.split()
    return float(num) * UNITS[unit]


def close3(printed: float, exact: float) -> bool:
    """Equal to the 3 significant digits the report prints."""
    return math.isclose(printed, exact, rel_tol=6e-3, abs_tol=1e-12)


# -- pipelined plans -----------------------------------------------------------------------------


def _positions(plan):
    pos = {n.name: i for i, n in enumerate(plan.graph.nodes)}
    return [(pos[s.nodes[0]], pos[s.nodes[-1]]) for s in plan.stages]


def _stage_table(text: str) -> dict[int, list[str]]:
    """The rows of the stage summary table, split into their columns."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("stage  nodes"))
    rows = {}
    for ln in lines[start + 2:]:
        if not ln.strip():
            break
        cells = re.split(r"\s{2,}", ln.strip())
        if cells[0].isdigit():
            rows[int(cells[0])] = cells
    return rows


def test_every_stage_is_listed_with_its_node_range_and_devices(piped_gpt):
    plan = piped_gpt.plan
    text = plan.report()
    rows = _stage_table(text)
    per = plan.stages[0].devices
    assert sorted(rows) == list(range(len(plan.stages)))
    for k, (a, b) in enumerate(_positions(plan)):
        cells = rows[k]
        assert cells[1] == f"{a}-{b}"
        assert cells[2] == f"{plan.stages[k].nodes[0]} .. {plan.stages[k].nodes[-1]}"
        assert cells[3] == f"{k * per}-{(k + 1) * per - 1}"
        # each stage has its own group of rows, headed by its node range and devices
        assert re.search(rf"^stage {k}: nodes {a}-{b}, devices {k * per}-{(k + 1) * per - 1};", text, re.M)
    # the ranges tile the graph in order
    ranges = _positions(plan)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(plan.graph.nodes) - 1
    assert all(ranges[k + 1][0] == ranges[k][1] + 1 for k in range(len(ranges) - 1))


def _stage_setup(plan, cluster):
    """What the planner priced stages on: the microbatch graph, one stage's devices, stage-local
    configs (the stage axes are the outer ones; ``stages`` devices groups take them)."""
    stages, per = len(plan.stages), plan.stages[0].devices
    sub = cluster.with_devices(per)
    outer, prod = 0, 1
    while prod < stages:
        prod *= cluster.mesh().shape[outer]
        outer += 1
    assert prod == stages
    local = {n: Config(c.splits, tuple(tuple(a - outer for a in ax) for ax in c.mesh_axes))
             for n, c in plan.assignment.items()}
    return scale_batch(plan.graph, plan.microbatches), sub, local


def test_stage_times_follow_the_schedule_formula(piped_gpt):
    plan, cluster = piped_gpt.plan, piped_gpt.cluster
    g, sub, local = _stage_setup(plan, cluster)
    model = AnalyticModel(optimizer="adam")  # plan()'s default optimizer, whose update is priced
    sync = []
    for a, b in _positions(plan):
        total = 0.0
        for node in g.nodes[a:b + 1]:
            nc = model.node_breakdown(node, local[node.name], sub, plan.mode, text=False)
            total += sum(t.seconds for t in nc.terms if t.kind in ("sync", "optimizer"))  # once per step
        sync.append(total)
    s, m = len(plan.stages), plan.microbatches
    times = [st.cost for st in plan.stages]
    # search.pipeline's model: (M + S - 1) x slowest stage per microbatch + slowest gradient sync,
    # for zero bubble (the flat search's choice: 1F1B's cuts and memory) (M + (S - 1) / 3)
    assert plan.schedule == "zero-bubble"
    slots = m + (s - 1) / 3
    assert plan.cost == pytest.approx(slots * max(times) + max(sync), rel=1e-9)

    for k, st in enumerate(plan.stage_rows):
        assert st.time == pytest.approx(times[k], rel=1e-9)
        assert st.sync == pytest.approx(sync[k], rel=1e-9, abs=1e-15)
        assert st.compute + st.comm + st.send_recv == pytest.approx(st.time, rel=1e-9)
        assert sum(x.compute + x.comm for x in st.nodes) == pytest.approx(st.compute + st.comm, rel=1e-9)
        assert sum(x.sync for x in st.nodes) == pytest.approx(st.sync, rel=1e-9, abs=1e-15)

    text = plan.report()
    rows = _stage_table(text)
    for k in range(s):
        assert close3(value(rows[k][4]), times[k])  # per microbatch
        assert close3(value(rows[k][8]), sync[k])  # grad sync per step
    pct = re.search(r"= ([0-9.]+)/([0-9.]+) = ([0-9.]+)% of the pipelined time", text)
    assert float(pct[1]) == pytest.approx((s - 1) / 3, rel=1e-3) and float(pct[2]) == pytest.approx(slots, rel=1e-3)
    assert float(pct[3]) == pytest.approx(100 * (s - 1) / 3 / slots, abs=0.05)
    assert f"schedule {plan.schedule}" in text and f"{m} microbatches" in text


def test_stage_memory_holds_the_schedules_in_flight_microbatches(piped_gpt):
    plan, cluster = piped_gpt.plan, piped_gpt.cluster
    g, sub, local = _stage_setup(plan, cluster)
    s, m = len(plan.stages), plan.microbatches
    mems = []
    shared = already_saved(g)  # a tensor several nodes save is held once
    for k, (a, b) in enumerate(_positions(plan)):
        held = m if plan.schedule == "gpipe" else min(m, s - k)  # 1F1B: stage k holds S - k
        total = 0.0
        for node in g.nodes[a:b + 1]:
            mb = node_memory(node, local[node.name], sub.mesh(), plan.mode, "adam",
                             shared=shared.get(node.name, frozenset()))
            # the loss's backward working set is once per stage, not per microbatch in flight
            total += mb.params + mb.grads + mb.optimizer + mb.transient + held * mb.activations
        mems.append((total, held))
    assert max(t for t, _ in mems) == pytest.approx(plan.memory_per_device, rel=1e-9)
    rows = _stage_table(plan.report())
    for k, (total, held) in enumerate(mems):
        assert close3(value(rows[k][9]), total)
        assert rows[k][10] == f"{held} mb"


def test_intra_stage_configs_are_in_words_on_the_stage_mesh(piped_gpt):
    plan, cluster = piped_gpt.plan, piped_gpt.cluster
    _, sub, local = _stage_setup(plan, cluster)
    text = plan.report()
    # a split node's words, from the graph's dim names (``seq`` for those along the sequence)
    # and the plan's splits
    split = [(n, plan.assignment[n.name]) for n in plan.graph.nodes
             if any(x > 1 for x in plan.assignment[n.name].splits)]
    assert split, "the stages split some nodes"
    seq = sequence_dims(plan.graph)
    for node, cfg in split:
        for d, x in zip(node.dims, cfg.splits):
            if x > 1:
                assert f"{'seq' if d.name in seq[node.name] else d.name}/{x}" in text, (node.name, d.name)
    # stage-local configs use only the stage mesh's axes
    assert plan.stage_mesh == sub.mesh().shape
    assert all(a < len(plan.stage_mesh) for c in local.values() for ax in c.mesh_axes for a in ax)


def test_a_pipelined_plan_loaded_from_a_file_prints_the_same_report(piped_gpt, tmp_path):
    plan = piped_gpt.plan
    path = tmp_path / "p.json"
    plan.save(path)
    loaded = autopar.Plan.load(path)
    assert loaded.graph is None and loaded.tables is None
    assert loaded.report() == plan.report()
    assert loaded.report(explain=True) == plan.report(explain=True)
    per = plan.stages[0].devices
    for k, st in enumerate(plan.stages):
        line = next(ln for ln in loaded.report().splitlines() if ln.strip().startswith(f"stage {k}:"))
        assert f"devices {k * per}-{(k + 1) * per - 1}" in line
        assert close3(value(re.search(r"; ([0-9.]+ [mun]?s) per microbatch", line)[1]), st.cost)


# -- PaSE plans --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pase_plan():
    model, inputs = autopar.zoo.get("alexnet", device="meta")
    return autopar.plan(model, inputs, autopar.Cluster(devices=8), cost_model="pase", space="pase")


def _pase_rows(text):
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("node  "))
    header = re.split(r"\s{2,}", lines[start].strip())
    rows = {}
    for ln in lines[start + 2:]:
        if not ln or ln.startswith("costs in"):
            break
        cells = re.split(r"\s{2,}", ln.strip())
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def test_pase_report_names_its_units_and_has_no_seconds(pase_plan):
    from autopar.pase import model as pase

    text = pase_plan.report()
    assert pase_plan.units == "pase-flop"
    assert "FLOP-equivalent" in text and "not seconds" in text
    r = float(re.search(r"r = ([0-9.e+]+) FLOP per 8-byte word", text)[1])
    assert r == pytest.approx(pase.rate(10.0, 16.0))  # the planner's default pase_rate
    rows = _pase_rows(text)
    assert len(rows) == len(pase_plan.graph.nodes)
    assert all(k.endswith("(pase-flop)") for k in next(iter(rows.values())) if k.split()[0] in
               ("compute", "comm", "total"))
    for row in rows.values():  # plain numbers in pase-flop, no time units
        for col in ("compute (pase-flop)", "comm (pase-flop)", "total (pase-flop)"):
            float(row[col])
    assert "memory per device" not in text  # PaSE's model has none; no "0 B" pretending otherwise


def test_pase_rows_add_up_to_pases_own_evaluation(pase_plan):
    from autopar.pase import model as pase

    g = pase_plan.graph
    strategy = {n.id: pase_plan.assignment[f"{n.id}:{n.op}"].splits for n in g.nodes}
    r = pase.rate(10.0, 16.0)
    total, layers, edges = pase.evaluate(g, strategy, r, breakdown=True)
    _, flops, _ = pase.evaluate(g, strategy, 0.0, breakdown=True)  # r = 0: arithmetic only
    assert total == pytest.approx(pase_plan.cost, rel=1e-9)
    nums = pase_plan.rows
    rows = _pase_rows(pase_plan.report())
    for n, x in zip(g.nodes, nums):
        into = sum(c for (u, v), c in edges.items() if v == n.id)
        assert x.compute == pytest.approx(flops[n.id], rel=1e-9, abs=1e-6)
        assert x.compute + x.comm == pytest.approx(layers[n.id] + into, rel=1e-9, abs=1e-6)
        row = rows[x.name]
        assert close3(float(row["total (pase-flop)"]), layers[n.id] + into)
        assert close3(float(row["compute (pase-flop)"]), flops[n.id])
    assert sum(x.compute + x.comm for x in nums) == pytest.approx(pase_plan.cost, rel=1e-9)


def test_pase_configs_are_in_words_with_pases_dim_names(pase_plan):
    text = pase_plan.report()
    rows = _pase_rows(text)
    names = {"Conv": ["b", "c_in", "h", "w", "r", "s", "n"], "Pool": ["b", "c", "h", "w"]}
    seen = set()
    for n in pase_plan.graph.nodes:
        key = f"{n.id}:{n.op}"
        splits = pase_plan.assignment[key].splits
        if n.op in names:
            dims = names[n.op]
        elif n.op == "FC":
            dims = ["b"] + [f"x{i}" for i in range(1, len(n.domain) - 2)] + ["n", "k"]
        else:
            continue
        words = ", ".join(f"{d}/{x}" for d, x in zip(dims, splits) if x > 1) or "replicated"
        assert rows[key]["split"] == words
        assert rows[key]["iteration space"] == " ".join(f"{d}={x}" for d, x in zip(dims, n.domain))
        seen.add(n.op)
    assert {"Conv", "Pool", "FC"} <= seen


# -- profiled plans ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    cache = tmp_path_factory.mktemp("prof") / "p.sqlite"
    mp = pytest.MonkeyPatch()
    mp.setenv("AUTOPAR_CACHE", str(cache))
    try:
        model, inputs = autopar.zoo.get("mlp", layers=2)
        plan = autopar.plan(model, inputs, "8xA100", cost_model="profiled")
    finally:
        mp.undo()
    return plan, cache


@pytest.mark.parametrize("which", ["autopar", "data_parallel"])
def test_profiled_compute_is_the_measurement_and_compute_plus_comm_is_the_table_cost(profiled, which):
    from autopar.core.cluster import Cluster
    from autopar.cost_models.profiled import ProfiledModel
    from autopar.core.layout import to_mesh
    from autopar.planning.breakdown import mesh_rows

    plan, cache = profiled
    nums = plan.rows
    if which != "autopar":  # data parallelism syncs weight gradients: comm is never all zero there
        plan = plan.baselines[which]
        nums = mesh_rows(plan.graph, plan.tables, plan.assignment,
                         ProfiledModel(cache_path=str(cache), fit_comm=False),
                         autopar.Cluster(**plan.cluster), plan.mode)
    t = plan.tables
    choice = [t.configs[i].index(plan.assignment[n]) for i, n in enumerate(t.nodes)]
    into = np.zeros(len(t.nodes))
    for (u, v), mat in t.edge_cost.items():
        into[v] += mat[choice[u], choice[v]]
    measured = ProfiledModel(cache_path=str(cache), fit_comm=False)
    cluster = Cluster(**plan.cluster)
    differ = 0
    for i, (node, x) in enumerate(zip(plan.graph.nodes, nums)):
        cost = float(t.node_cost[i][choice[i]])
        assert x.compute + x.comm == pytest.approx(cost + into[i], rel=1e-9, abs=1e-15)
        timing = measured.timing(node, to_mesh(plan.assignment[node.name], cluster.mesh()))
        if timing.error is None:  # the cached measurement, fwd + bwd, is the compute column
            assert x.compute == pytest.approx(timing.forward + timing.backward, rel=1e-9)
        differ += not math.isclose(x.compute, x.comm)
    assert measured.measurements == 0  # everything came from the plan's cache
    assert differ == len(nums)  # the old report printed the node cost in both columns
    if which == "data_parallel":
        assert sum(x.comm > 0 for x, n in zip(nums, plan.graph.nodes) if n.params) >= 3
    assert sum(x.compute + x.comm for x in nums) == pytest.approx(plan.cost, rel=1e-9)


def test_profiled_report_rows_print_those_numbers(profiled):
    plan, _ = profiled
    text = plan.report()
    assert "compute measured on the local machine" in text
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("module"))
    rows: dict[str, list] = {}
    for ln in lines[start + 2:]:
        if not ln.strip() or ln.startswith("placements"):
            break
        cells = re.split(r"\s{2,}", ln.strip())
        rows.setdefault(cells[0], []).append(cells)
    checked = 0
    for node, x in zip(plan.graph.nodes, plan.rows):
        found = rows.get(node.module or node.name, [])
        if len(found) == 1:  # a label printed once (not folded, not shared by several nodes)
            assert close3(value(found[0][-3]), x.compute) and close3(value(found[0][-2]), x.comm)
            checked += 1
    assert checked >= 3


# -- pictures ------------------------------------------------------------------------------------


def test_pictures_of_pipelined_pase_and_profiled_plans(piped_gpt, pase_plan, profiled, tmp_path):
    from autopar.report.picture import draw

    plan = piped_gpt.plan
    loaded = tmp_path / "p.json"
    plan.save(loaded)
    for name, p in [("pipe", plan), ("pase", pase_plan), ("prof", profiled[0]),
                    ("loaded-pipe", autopar.Plan.load(loaded))]:
        out = draw(p, tmp_path / f"{name}.png")
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    svg = draw(plan, tmp_path / "pipe.svg").read_text()
    assert "<svg" in svg and f"stage {len(plan.stages) - 1}" in svg  # matplotlib keeps text as comments
    profiled[0].save(tmp_path / "flat.json")
    assert draw(autopar.Plan.load(tmp_path / "flat.json"), tmp_path / "flat.png").read_bytes()[:4] == b"\x89PNG"
    old = json.loads((tmp_path / "flat.json").read_text())
    del old["rows"]  # a file from before plans carried their rows
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match="no per-node rows"):
        draw(autopar.Plan.load(tmp_path / "old.json"), tmp_path / "x.png")


def test_a_saved_pipelined_plan_keeps_each_stages_sync_and_memory(piped_gpt, tmp_path):
    plan = piped_gpt.plan
    plan.save(tmp_path / "piped.json")
    loaded = autopar.Plan.load(tmp_path / "piped.json")
    m, s = loaded.microbatches, len(loaded.stages)
    # the schedule's step formula from the file's own fields gives back the plan's cost
    bubble = (s - 1) / 3 if loaded.schedule == "zero-bubble" else s - 1
    step = (m + bubble) * max(st.cost for st in loaded.stages) + max(st.sync for st in loaded.stages)
    assert step == pytest.approx(loaded.cost, rel=1e-9)
    assert max(st.sync for st in loaded.stages) > 0
    assert max(st.memory for st in loaded.stages) == pytest.approx(loaded.memory_per_device, rel=1e-9)
    # without its graph the report still lists every stage's sync and memory
    rows = _stage_table(loaded.report())
    for k, st in enumerate(loaded.stages):
        assert close3(value(rows[k][8]), st.sync) and close3(value(rows[k][9]), st.memory)


def test_each_stage_records_its_compute_per_step(piped_gpt):
    """``Stage.compute`` (what ``autopar measure`` compares a stage's step with): its microbatches'
    compute and the optimizer update once; at least the microbatches' compute its rows list, and
    the stage's time per microbatch never less than its compute per microbatch."""
    plan = piped_gpt.plan
    m = plan.microbatches
    for stage, row in zip(plan.stages, plan.stage_rows):
        assert stage.compute is not None and stage.compute >= m * row.compute > 0
        assert stage.cost >= row.compute * (1 - 1e-9)
