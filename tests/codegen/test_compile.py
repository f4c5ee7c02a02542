"""``autopar.compile``: plan on rank 0, the same plan on every rank, a module that trains like one device.

Threads on torch's threaded process group stand in for torchrun's processes (three tests run real
gloo processes through ``autopar.runtime.launch.launch``, all three cases in one launch). Every numerics check is against a single-device run of
the unsplit model (``reference_run``), never against numbers taken from autopar.
"""

from __future__ import annotations

import pytest
import torch

import autopar
from autopar.compiler import torchrun_command
from tests.helpers.dist_utils import run_gloo, run_threaded
from tests.helpers.numerics import check_module, reference_run


def _gpt():
    return autopar.zoo.get("gpt", layers=1, batch=4, seq=8, width=16, heads=2, vocab=32)


@pytest.fixture(scope="module")
def gpt():
    model, inputs = _gpt()
    return model, inputs, reference_run(model, inputs)


def _compile_and_train(rank, world, model, inputs, ref, kwargs):
    module = autopar.compile(model, inputs, **kwargs)
    check_module(rank, module, inputs, ref)
    return module.plan.to_json()


# big enough that the cpu preset's plan splits (the tiny one above stays replicated, and a
# replicated plan trains like one device with no gradient sync at all)
SPLIT_GPT = dict(layers=1, batch=16, seq=32, width=128, heads=4, vocab=128)


def test_compiled_gpt_trains_like_one_device_and_every_rank_runs_rank0s_plan():
    model, inputs = autopar.zoo.get("gpt", **SPLIT_GPT)
    docs = run_threaded(_compile_and_train, 4, model, inputs, reference_run(model, inputs), {})
    assert all(d == docs[0] for d in docs), "ranks run different plans"
    assert docs[0]["mesh"]["shape"] == [2, 2]
    plan = autopar.Plan.from_json(docs[0])
    split = [n for n, c in plan.assignment.items() if any(s > 1 for s in c.splits)]
    assert len(split) > len(plan.assignment) // 2, f"the plan splits only {split}"


def test_compile_with_a_saved_plan_does_not_search(gpt, tmp_path, monkeypatch):
    model, inputs, ref = gpt
    # a plan that is not the searched best (data parallel), so using it is visible in the result
    plan = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=2)).baselines["data_parallel"]
    path = tmp_path / "plan.json"
    plan.save(path)

    def no_search(*args, **kwargs):
        raise AssertionError("compile searched although a plan was given")

    monkeypatch.setattr("autopar.planning.planner.plan", no_search)
    docs = run_threaded(_compile_and_train, 2, model, inputs, ref, {"plan": str(path)})
    assert docs[0]["assignment"] == plan.to_json()["assignment"]


def _expect_error(rank, world, model, inputs, kwargs, kind):
    with pytest.raises(kind) as info:
        autopar.compile(model, inputs, **kwargs)
    return str(info.value)


def test_a_plan_for_another_model_is_refused_on_every_rank(tmp_path):
    model, inputs = _gpt()
    other, other_inputs = autopar.zoo.get("mlp")
    autopar.plan(other, other_inputs, autopar.Cluster.preset("cpu", devices=2)).save(tmp_path / "mlp.json")
    messages = run_threaded(_expect_error, 2, model, inputs, {"plan": str(tmp_path / "mlp.json")},
                            autopar.PlanMismatchError)
    assert all("another model" in m for m in messages)


def test_an_error_while_planning_on_rank0_reaches_every_rank_instead_of_hanging():
    model, inputs = _gpt()
    messages = run_threaded(_expect_error, 2, model, inputs, {"memory_capacity": 1024.0},
                            autopar.InfeasibleError)
    assert all("GiB per device" in m for m in messages)


def test_devices_without_a_process_group_name_the_torchrun_command():
    model, inputs = _gpt()
    with pytest.raises(autopar.LaunchRequiredError) as info:
        autopar.compile(model, 4, inputs)
    assert "torchrun --nproc-per-node 4" in str(info.value)
    assert torchrun_command(2, ["train.py", "--steps", "3"]) == "torchrun --nproc-per-node 2 train.py --steps 3"


def test_one_device_without_a_process_group_is_the_model_with_its_plan():
    model, inputs = _gpt()
    module = autopar.compile(model, 1, inputs)
    assert module.plan.devices == 1
    torch.testing.assert_close(module(*inputs), model(*inputs))
    assert [n for n, _ in module.named_parameters()] == [n for n, _ in model.named_parameters()]


def test_bad_arguments_are_one_line_errors(gpt):
    model, inputs, _ = gpt
    for kwargs, kind in (({"devices": 0}, ValueError), ({"devices": "two"}, ValueError)):
        with pytest.raises(kind):
            autopar.compile(model, kwargs["devices"], inputs)
    with pytest.raises(ValueError, match="example inputs go third"):
        autopar.compile(model, 1, 5)
    with pytest.raises(ValueError, match="drop the planning options"):
        autopar.compile(model, 1, inputs, plan="x.json", search="dp")
    with pytest.raises(ValueError, match="outputs must be"):  # on one device too (it was accepted)
        autopar.compile(model, 1, inputs, outputs="dtensors")


def _world_mismatch(rank, world, model, inputs):
    with pytest.raises(ValueError, match="process group of 2"):
        autopar.compile(model, 4, inputs)


def test_devices_must_match_the_process_group(gpt):
    model, inputs, _ = gpt
    run_threaded(_world_mismatch, 2, model, inputs)


def _gloo_first_loss(rank, world):
    model, inputs = _gpt()
    module = autopar.compile(model, inputs)
    loss = module(*inputs)
    loss.backward()
    return float(loss), module.plan.fingerprint


def _gloo_cases(rank, world, plan_path, cache):
    """The module's real-gloo cases, one after another in one launch of 2 processes (a launch
    starts an interpreter per rank and imports torch: on a busy machine of few cores that is most of a
    case's time). The profiled one goes last: it points the profile cache elsewhere."""
    return {"first_loss": _gloo_first_loss(rank, world), "pipelined": _pipelined_losses(rank, world, plan_path),
            "profiled": _gloo_profiled(rank, world, cache)}


@pytest.fixture(scope="module")
def gloo_results(tmp_path_factory):
    """Per case, every rank's result, from one launch."""
    from autopar.core.fingerprint import fingerprint
    from tests.helpers.plans import two_stage_plan

    folder = tmp_path_factory.mktemp("gloo")
    model, inputs = _gpt()
    graph = autopar.trace(model, inputs)
    plan = two_stage_plan(graph, microbatches=2, schedule="1f1b")
    plan.fingerprint = fingerprint(graph)
    plan.save(folder / "piped.json")
    per_rank = run_gloo(_gloo_cases, 2, str(folder / "piped.json"), str(folder / "profile.sqlite"))
    return {case: [r[case] for r in per_rank] for case in per_rank[0]}


def test_compile_on_real_gloo_processes(gloo_results):
    model, inputs = _gpt()
    results = gloo_results["first_loss"]
    expected = float(model(*inputs))
    for loss, fp in results:
        assert loss == pytest.approx(expected, rel=1e-5)
    assert results[0][1] == results[1][1]


def _gloo_profiled(rank, world, cache):
    import os

    os.environ["AUTOPAR_CACHE"] = cache
    model, inputs = _gpt()
    module = autopar.compile(model, inputs, cost_model="profiled")
    loss = module(*inputs)
    loss.backward()
    return float(loss), module.plan.to_json(), module.plan.cost_model


@pytest.mark.slow
def test_compile_with_the_profiled_model_fits_links_on_every_rank(gloo_results):
    """The profiled model's fit runs collectives: every rank fits, rank 0 plans (this hung when
    rank 0 fitted alone while the others waited for its plan)."""
    model, inputs = _gpt()
    results = gloo_results["profiled"]
    expected = float(model(*inputs))
    for loss, plan, kind in results:
        assert loss == pytest.approx(expected, rel=1e-5) and kind == "profiled"
    assert results[0][1] == results[1][1]  # rank 0's plan on both


def test_a_cost_model_object_plans_under_its_own_name(tmp_path):
    from autopar.cost_models.analytic import AnalyticModel
    from autopar.cost_models.profiled import ProfiledModel

    model, inputs = _gpt()
    cluster = autopar.Cluster.preset("cpu", devices=2)
    by_name = autopar.plan(model, inputs, cluster, cost_model="analytic")
    given = autopar.plan(model, inputs, cluster, cost_model=AnalyticModel(optimizer="adam"))
    assert given.cost_model == "analytic" and given.assignment == by_name.assignment
    assert given.cost == pytest.approx(by_name.cost)
    profiled = ProfiledModel(cache_path=str(tmp_path / "p.sqlite"), fit_comm=False)
    assert autopar.plan(model, inputs, cluster, cost_model=profiled).cost_model == "profiled"
    assert profiled.measurements > 0  # the given model was profiled for this graph
    with pytest.raises(ValueError, match="cost_model must be a name"):
        autopar.plan(model, inputs, cluster, cost_model=3)


def _pipelined_losses(rank, world, plan_path):
    from autopar.cli.training import train_steps

    model, inputs = _gpt()
    module = autopar.compile(model, inputs, plan=plan_path)
    names = [n for n, _ in module.named_parameters()]
    return train_steps(module, inputs, 3), names, len(module.plan.stages)


def test_compile_runs_a_pipelined_plan_through_torch_pipelining(gloo_results):
    from autopar.cli.training import single_process_losses

    model, inputs = _gpt()
    results = gloo_results["pipelined"]
    expected = single_process_losses(model, inputs, 3)
    all_names = [n for n, _ in model.named_parameters()]
    for losses, names, stages in results:
        assert stages == 2
        assert losses == pytest.approx(expected, rel=1e-5)
    assert sorted(results[0][1] + results[1][1]) == sorted(all_names)  # each parameter on one stage


def _dtensor_outputs(rank, world, model, inputs, expected):
    from torch.distributed.tensor import DTensor

    module = autopar.compile(model, inputs, outputs="dtensor")
    loss = module(*inputs)
    assert isinstance(loss, DTensor), type(loss)
    torch.testing.assert_close(loss.full_tensor(), expected)
    return tuple(str(p) for p in loss.placements)


def test_outputs_can_stay_dtensors_in_the_plans_layout(gpt):
    model, inputs, _ = gpt
    placements = run_threaded(_dtensor_outputs, 2, model, inputs, model(*inputs).detach())
    assert all(p == placements[0] for p in placements)


def test_a_pase_plan_file_is_refused_not_run_replicated(tmp_path):
    model, inputs = autopar.zoo.get("mlp")
    pase = autopar.plan(model, inputs, autopar.Cluster(devices=2), cost_model="pase", space="pase:1")
    pase.save(tmp_path / "pase.json")
    with pytest.raises(ValueError, match="cost_model='pase'"):
        autopar.compile(model, 1, inputs, plan=str(tmp_path / "pase.json"))
