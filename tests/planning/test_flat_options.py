"""ZeRO, recomputation and precision on the flat path (planning/options.py): searched when memory
binds, exact over the option sets, and given to the data-parallel baseline so that "data
parallelism does not fit" is compared fairly."""

from __future__ import annotations

import pytest

import autopar
from autopar.core.margin import device_memory_for
from autopar.core.errors import InfeasibleError


@pytest.fixture(scope="module")
def gpt():
    return autopar.zoo.get("gpt", layers=2, width=512, heads=8, vocab=4096, seq=64, batch=8, device="meta")


def test_without_memory_pressure_zero1_is_searched_and_recomputation_is_not_chosen(gpt):
    """ZeRO-1 moves plain data parallelism's bytes and steps the optimizer on a 1/d shard: with
    bf16 compute the fp32 Adam step is a large part of this small GPT's step, so ZeRO-1 wins
    without any memory pressure; recomputation (only more compute) is not chosen."""
    model, inputs = gpt
    auto = autopar.plan(model, inputs, "8xA100", pipeline=False)
    each = {z: autopar.plan(model, inputs, "8xA100", pipeline=False, zero=z, recompute=False, baselines=False)
            for z in (0, 1)}
    assert each[1].cost < each[0].cost
    assert auto.cost == each[1].cost and auto.assignment == each[1].assignment
    assert auto.strategy.options.zero == 1 and not auto.strategy.options.recompute


def test_zero_lets_data_parallelism_fit_and_the_search_is_exact_over_the_options(gpt):
    model, inputs = gpt
    free = autopar.plan(model, inputs, "8xA100", pipeline=False, zero=0, recompute=False)
    cap = 0.5 * free.baselines["data_parallel"].memory_per_device
    device = device_memory_for(cap)  # a device of which a plan may use cap (the margin, core/margin.py)
    # the flat search alone (under "auto", memory binding it also runs the hierarchical search,
    # whose plan is returned where faster: planning/fallback.py)
    plan = autopar.plan(model, inputs, "8xA100", pipeline=False, memory_capacity=device, hierarchical=False)
    dp = plan.baselines["data_parallel"]
    assert dp.memory_per_device <= cap and dp.strategy.options.zero >= 1  # FSDP-style data parallelism
    assert plan.memory_per_device <= cap and plan.cost <= dp.cost
    # every option set searched on its own: the automatic choice is the fastest that fits
    costs = {}
    for zero in range(4):
        for recompute in (False, True):
            try:
                p = autopar.plan(model, inputs, "8xA100", pipeline=False, memory_capacity=device, zero=zero,
                                 recompute=recompute, baselines=False, hierarchical=False)
            except InfeasibleError:
                continue
            costs[(zero, recompute)] = p.cost
    # the rule (planning/options.py) skips only sets that cannot win: the automatic choice is
    # the fastest of every set searched on its own
    assert plan.cost == pytest.approx(min(costs.values()), rel=1e-12)
    opts = plan.strategy.options
    assert costs[(opts.zero, opts.recompute)] == pytest.approx(plan.cost, rel=1e-12)
    if opts.zero:
        assert plan.strategy.zero_axes  # the mesh axes its batch is split along
    saved = autopar.Plan.from_json(plan.to_json())
    assert saved.strategy.options == opts


def test_mixed_precision_on_the_flat_path(gpt):
    """bf16 runs matmuls at the A100's 312 TFLOP/s instead of fp32's 19.5 and halves activations."""
    model, inputs = gpt
    fp32 = autopar.plan(model, inputs, "8xA100", pipeline=False, baselines=False, precision="fp32")
    bf16 = autopar.plan(model, inputs, "8xA100", pipeline=False, baselines=False, precision="bf16")
    assert bf16.cost < fp32.cost and bf16.strategy.options.precision == "bf16"
    with pytest.raises(ValueError, match="precision"):
        autopar.plan(model, inputs, "8xA100", precision="fp8", baselines=False)


def test_the_default_precision_is_one_rule_on_both_paths(gpt):
    """Training on GPUs defaults to their fastest mixed precision on the flat path as on the
    hierarchical one (the A100's bf16: 312 against fp32's 19.5 TFLOP/s); the cpu preset, whose
    half precision is no faster, stays fp32; so does inference. The default prices exactly what
    asking for bf16 prices."""
    model, inputs = gpt
    flat = autopar.plan(model, inputs, "8xA100", pipeline=False, baselines=False)
    asked = autopar.plan(model, inputs, "8xA100", pipeline=False, baselines=False, precision="bf16")
    assert flat.strategy.options.precision == "bf16" and flat.space != "hierarchical"
    assert flat.cost == asked.cost
    hier = autopar.plan(model, inputs, "8xA100", hierarchical=True, baselines=False)
    assert hier.strategy.options.precision == "bf16"
    cpu = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=2), pipeline=False, baselines=False)
    assert cpu.strategy.options.precision == "fp32"
    infer = autopar.plan(model, inputs, "8xA100", mode="inference", pipeline=False, baselines=False)
    assert infer.strategy is None or infer.strategy.options.precision == "fp32"


def test_zero_stages_carry_the_names_users_know_them_by():
    """ZeRO-3 is FSDP2's fully_shard, ZeRO-2 its reshard_after_forward=False, in the plan's words."""
    from autopar.core.strategy import TrainingOptions

    assert "FSDP2 fully_shard)" in TrainingOptions(zero=3).describe()
    assert "reshard_after_forward=False" in TrainingOptions(zero=2).describe()
    assert "FSDP" not in TrainingOptions(zero=1).describe()


@pytest.fixture(scope="module")
def long_gpt():
    """A GPT whose activations, not its weights, fill the memory (sequence 1024, width 128)."""
    model, inputs = autopar.zoo.get("gpt", layers=4, width=128, heads=4, vocab=512, seq=1024, batch=64, device="meta")
    return model, inputs, autopar.trace(model, inputs)


def test_recomputing_every_kth_block_is_priced_per_block_and_chosen_where_it_fits_best(long_gpt):
    """Every 2nd (blocks 0, 2) and every 4th block (block 0): each recomputed block adds a quarter
    of what recomputing all four adds to the step and saves a quarter of their memory (the
    blocks are identical); with the memory of the every-2nd plan, it is the automatic choice:
    nothing sparser fits, recomputing every block is slower."""
    model, inputs, g = long_gpt
    kw = dict(graph=g, pipeline=False, baselines=False, zero=0, accumulate=1)  # recomputation alone
    each = {k: autopar.plan(model, inputs, "8xA100", recompute=k, **kw) for k in (False, 4, 2, True)}
    assert each[2].strategy.recompute == ("blocks.0", "blocks.2") and each[4].strategy.recompute == ("blocks.0",)
    none, full = each[False], each[True]
    for k, blocks in ((4, 1), (2, 2)):
        assert each[k].cost - none.cost == pytest.approx(blocks / 4 * (full.cost - none.cost), rel=1e-9)
        assert none.memory_per_device - each[k].memory_per_device == pytest.approx(
            blocks / 4 * (none.memory_per_device - full.memory_per_device), rel=1e-9)
    cap = each[2].memory_per_device
    auto = autopar.plan(model, inputs, "8xA100", memory_capacity=device_memory_for(cap), **kw)
    assert auto.strategy.options.recompute and auto.strategy.options.every == 2
    assert auto.cost == pytest.approx(each[2].cost, rel=1e-12) and auto.cost < full.cost
    assert "recompute every 2 blocks" in auto.strategy.options.describe()
