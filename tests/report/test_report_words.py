"""Reports say what they mean: a plan that splits nothing says so and why, speed-ups
are words ("1.13x faster", "1.12x slower", "as fast"), the memory shown is the one planned for,
plans over it are marked "does not fit" and never compared as if they ran, and diverged losses
are not "equal"."""

import json
import math

import pytest

import autopar
from tests.helpers.cli_utils import cli
from autopar.planning.plan import Plan, SearchInfo
from autopar.core.tables import Config, Mesh
from autopar.report.format import fmt_bytes
from autopar.cli.training import LossComparison


@pytest.fixture
def run():
    return cli  # the command line in this process (tests/helpers/cli_utils.py)


@pytest.mark.parametrize("ratio, words", [
    (1.13, "1.13x faster"), (1 / 1.12, "1.12x slower"), (1 / 0.889, "1.12x faster"), (0.889, "1.12x slower"),
    (1.0, "as fast (equal to 3 digits)"), (1.004, "as fast (equal to 3 digits)"), (0.996, "as fast (equal to 3 digits)"),
    (32.7, "32.7x faster"),
])
def test_speed_ups_are_words_never_1x_or_below_1x(ratio, words):
    from autopar.report.format import speed_words

    assert speed_words(ratio) == words


def _splits_nothing(plan) -> bool:
    return all(all(s == 1 for s in c.splits) for c in plan.assignment.values())


def test_a_plan_that_splits_nothing_says_no_parallelism_not_faster(tmp_path):
    model, inputs = autopar.zoo.get("mlp")
    plan = autopar.plan(model, inputs, autopar.Cluster(devices=4))
    assert _splits_nothing(plan)  # the case itself, checked on the assignment, not on the report
    text = plan.report()
    assert "no parallelism: every device runs the whole model" in text
    assert "autopar is" not in text and "why: splitting over 2 devices costs more than it saves" in text
    plan.save(tmp_path / "p.json")
    assert Plan.load(tmp_path / "p.json").report() == text  # the notice is part of the file


@pytest.mark.parametrize("devices", [3, 7])
def test_devices_that_divide_no_dim_are_named_as_the_reason(devices):
    model, inputs = autopar.zoo.get("gpt")
    plan = autopar.plan(model, inputs, autopar.Cluster(devices=devices))
    assert _splits_nothing(plan)
    odd = [n for n in plan.graph.nodes if not any(d.size % devices == 0 for d in n.dims)]
    assert 2 * len(odd) > len(plan.graph.nodes)  # the case: most nodes have no dim that divides
    text = plan.report()
    assert "no parallelism: every device runs the whole model" in text
    assert f"({len(odd)} of {len(plan.graph.nodes)} have no dim that divides by {devices}, e.g. " in text


def test_a_mesh_axis_that_splits_nothing_gets_a_notice():
    model, inputs = autopar.zoo.get("gpt")
    plan = autopar.plan(model, inputs, autopar.Cluster(devices=6))
    assert plan.mesh.shape == (2, 3)
    assert not any(1 in axes for c in plan.assignment.values() for axes in c.mesh_axes)
    assert any(0 in axes for c in plan.assignment.values() for axes in c.mesh_axes)
    text = plan.report()
    assert "mesh axis 1 (3 devices) splits no node: the devices along it repeat the same work" in text
    assert "no parallelism" not in text


def test_memory_shown_is_the_one_planned_for_and_baselines_over_it_do_not_fit(run, tmp_path):
    # a device of which a plan may use 0.0058 GiB: 10% and 512 MiB are its safety margin
    gib = (0.0058 * 2**30 + 2**29) / 0.9 / 2**30
    cap = gib * 2**30
    usable = 0.9 * cap - 2**29
    out = tmp_path / "p.json"
    # the flat search's report (memory binds it: "auto" would run the hierarchical search beside it)
    r = run("plan", "zoo:gpt:layers=1", "--devices", "4", "--memory", str(gib), "--json", str(out),
            "--hierarchical", "off")
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["cluster"]["memory_capacity"] == cap
    assert f"of {fmt_bytes(cap)}" in r.stdout and "74.5 GiB" not in r.stdout
    plan = Plan.load(out)
    over = {k: b for k, b in plan.baselines.items() if b.memory_per_device > usable}
    assert "expert" in over and plan.memory_per_device <= usable  # the case: the expert plan does not fit
    for name, b in over.items():
        line = next(x for x in r.stdout.splitlines() if x.startswith(f"  vs {name.replace('_', ' ')}:"))
        assert line.endswith(f"does not fit ({fmt_bytes(b.memory_per_device)} > {fmt_bytes(usable)} usable of {fmt_bytes(cap)})")
        assert "faster" not in line and "slower" not in line
    r = run("compare", "zoo:gpt:layers=1", "--devices", "4", "--memory", str(gib), "--hierarchical", "off")
    assert r.returncode == 0, r.stderr
    expert = next(x for x in r.stdout.splitlines() if x.startswith("expert "))
    assert expert.endswith(f"does not fit ({fmt_bytes(over['expert'].memory_per_device)} > {fmt_bytes(usable)} usable of "
                           f"{fmt_bytes(cap)})")
    auto = next(x for x in r.stdout.splitlines() if x.startswith("autopar "))
    assert auto.endswith(_words(plan.baselines["data_parallel"].cost / plan.cost))


def _words(ratio):  # what the report says for a speed-up, written out here, not imported
    big = max(ratio, 1 / ratio)
    return "as fast (equal to 3 digits)" if f"{big:.3g}" == "1" else f"{big:.3g}x {'faster' if ratio > 1 else 'slower'}"


def _plan(cost, memory, baselines=None, capacity=2**30):
    return Plan("m", "fp", {"name": "flat", "devices": 4, "memory_capacity": capacity}, Mesh((4,), (0,)),
                "analytic", "mesh", "train", {"fc": Config((4, 1), ((0,), ()))}, cost, "s", memory,
                SearchInfo("dp", 0.1), baselines=baselines or {})


def test_data_parallel_over_memory_is_never_compared_as_if_it_ran():
    dp = _plan(2.0, 3 * 2**30)  # 3 GiB on 1 GiB devices: it would not run
    plan = _plan(1.0, 2**28, {"data_parallel": dp, "expert": _plan(1.5, 2**28)})
    text = plan.report()
    usable = fmt_bytes(0.9 * 2**30 - 2**29)  # a plan may use the capacity less 10% and 512 MiB
    assert f"vs data parallel: 2 s, 3 GiB/device: does not fit (3 GiB > {usable} usable of 1 GiB)" in text
    assert "vs expert: 1.5 s, 256 MiB/device -> autopar is 1.5x faster" in text
    from autopar.report.compare import compare_lines

    lines = compare_lines(plan)
    assert f"data parallel does not fit (3 GiB > {usable} usable of 1 GiB): no plan is compared with it" in lines
    assert not any("faster" in x or "slower" in x for x in lines)


def test_diverged_losses_are_not_equal():
    c = LossComparison([2.0, math.nan, math.nan], [2.0, math.nan, math.nan], 2)
    assert not c.equal and "not finite" in c.diverged and "from step 1" in c.diverged
    assert LossComparison([2.0, math.inf], [2.0, 1.0], 2).diverged
    assert LossComparison([2.0, 1.0], [2.0, 1.0], 2).equal and not LossComparison([2.0], [2.0], 2).diverged


def test_run_with_a_diverging_learning_rate_exits_2_in_one_line(run):
    r = run("run", "zoo:mlp:batch=16,hidden=32", "--nproc", "1", "--steps", "2", "--lr", "1e30")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "the losses diverged: not finite" in r.stderr
    assert "\nequal" not in r.stdout
