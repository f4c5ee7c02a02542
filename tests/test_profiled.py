"""The profiled cost model: cached measurements, sane timings, and autopar.plan wiring."""

from __future__ import annotations

import dataclasses
import io
import math

import torch

import autopar
from autopar.cost_models.profiled import Progress, ProfiledModel, fit_collectives
from autopar.cost_models.tables import build_tables
from autopar.tables import Config

CPU2 = autopar.Cluster.preset("cpu", devices=2)


def _mlp_graph():
    return autopar.trace(*autopar.zoo.get("mlp"))


def test_second_run_measures_nothing(tmp_path):
    g = _mlp_graph()
    path = tmp_path / "profile.sqlite"
    first = ProfiledModel(cache_path=str(path))
    first.profile(g, CPU2)
    t1 = build_tables(g, CPU2, first)
    assert first.measurements > 0
    second = ProfiledModel(cache_path=str(path))
    assert second.profile(g, CPU2) == 0
    t2 = build_tables(g, CPU2, second)
    assert second.measurements == 0 and second.cache.misses == 0 and second.cache.hits > 0
    for a, b in zip(t1.node_cost, t2.node_cost):
        assert (a == b).all()  # the same cached numbers


def test_env_var_sets_default_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOPAR_CACHE", str(tmp_path / "env.sqlite"))
    assert ProfiledModel().cache.path == tmp_path / "env.sqlite"


def test_larger_matmul_shard_measures_slower(tmp_path):
    g = autopar.trace(torch.nn.Linear(384, 384), (torch.randn(512, 384),))
    node = next(n for n in g.nodes if n.op == "linear")
    model = ProfiledModel(cache_path=str(tmp_path / "p.sqlite"))
    full = Config(tuple(1 for _ in node.dims))
    batch = [d.name for d in node.dims].index(node.inputs[0].spec.axes[0][0])
    quarter = Config(tuple(4 if i == batch else 1 for i in range(len(node.dims))))
    big, small = model.timing(node, full), model.timing(node, quarter)
    assert not big.error and not small.error
    assert big.forward > 0 and small.forward > 0 and big.backward >= 0
    assert (big.forward + big.backward) / (small.forward + small.backward) > 1


def test_breakdown_says_measured_or_fallback(tmp_path):
    g = _mlp_graph()
    model = ProfiledModel(cache_path=str(tmp_path / "p.sqlite"))
    node = g.nodes[0]
    cfg = Config(tuple(1 for _ in node.dims))
    labels = [t.label for t in model.node_breakdown(node, cfg, CPU2).terms]
    assert "compute forward (measured)" in labels and "compute backward (measured)" in labels
    odd = dataclasses.replace(node, op="mystery")
    nc = model.node_breakdown(odd, cfg, CPU2)
    assert any("analytic, not measured" in t.label for t in nc.terms)
    assert math.isfinite(nc.seconds) and nc.seconds > 0


def test_plan_with_profiled_model(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOPAR_CACHE", str(tmp_path / "plan.sqlite"))
    model, inputs = autopar.zoo.get("mlp")
    plan = autopar.plan(model, inputs, CPU2, cost_model="profiled")
    assert plan.cost_model == "profiled" and math.isfinite(plan.cost) and plan.cost > 0
    dp = plan.baselines["data_parallel"]
    assert dp.cost_model == "profiled" and dp.tables is plan.tables  # priced by the same model
    assert plan.cost <= dp.cost + 1e-12
    assert "profiled" in plan.report()


def test_progress_bar_only_when_asked():
    quiet = io.StringIO()
    bar = Progress(3, stream=quiet)  # StringIO is no terminal
    for _ in range(3):
        bar.step("x")
    assert quiet.getvalue() == ""
    loud = io.StringIO()
    bar = Progress(2, stream=loud, enabled=True)
    bar.step("a")
    bar.step("b")
    assert "2/2" in loud.getvalue() and loud.getvalue().endswith("\n")


def test_no_process_group_keeps_cluster_links(tmp_path):
    assert fit_collectives() is None
    model = ProfiledModel(cache_path=str(tmp_path / "p.sqlite"))
    assert model.comm_cluster(CPU2) == CPU2


def _fit_worker(rank, world, init, out):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        fit = fit_collectives(sizes=(2 ** 10, 2 ** 16, 2 ** 18), repeats=3)
        model = ProfiledModel(cache_path=f"{out}.sqlite")
        cl = model.comm_cluster(autopar.Cluster.preset("cpu", devices=world))
        with open(f"{out}.{rank}", "w") as f:
            f.write(f"{fit.latency} {fit.bandwidth} {cl.intra_latency} {cl.intra_bandwidth}")
    finally:
        dist.destroy_process_group()


def test_alpha_beta_fitted_on_live_gloo_group(tmp_path):
    import torch.multiprocessing as mp

    out = str(tmp_path / "fit")
    mp.spawn(_fit_worker, args=(2, f"file://{tmp_path}/rendezvous", out), nprocs=2)
    rows = [[float(v) for v in open(f"{out}.{r}").read().split()] for r in range(2)]
    assert rows[0] == rows[1]  # every rank prices plans alike
    lat, bw, c_lat, c_bw = rows[0]
    assert lat > 0 and bw > 0 and c_lat > 0 and c_bw > 0
    preset = autopar.Cluster.preset("cpu", devices=2)
    assert (c_lat, c_bw) != (preset.intra_latency, preset.intra_bandwidth)  # the model's own fit
