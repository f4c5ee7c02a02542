"""``autopar.compile`` on the zoo: autopar's plan, data parallel and a forced "split everything" plan.

For mlp, cnn, rnnlm and the transformer (gpt has its own cases in test_compile.py and the
test_codegen_* files) on 2 and 4 ranks of a threaded process group: forward losses, every gradient
and every parameter after 3 AdamW steps match a single-device run of the unsplit model.

The forced plan gives every node the config that cuts the most of its dims, reduction dims first
(a linear's in-features, a conv's in-channels, an LSTM's hidden units, an einsum's heads): the
rules a searched plan on this small CPU cluster rarely picks are exercised anyway.
"""

from __future__ import annotations

import pytest

import autopar
from tests.helpers.dist_utils import run_threaded
from tests.helpers.numerics import check_module, reference_run
from tests.helpers.plans import split_plan

SIZES = {
    "mlp": dict(batch=8, inputs=8, hidden=16, layers=2, classes=4),
    "cnn": dict(blocks=1, batch=4, channels=4, image=8),
    "rnnlm": dict(batch=4, seq=6, vocab=32, units=8, layers=2),
    "transformer": dict(batch=4, seq=8, vocab=32, width=16, heads=2, hidden=32, layers=1),
}
PLANS = ("autopar", "data_parallel", "split_everything")


@pytest.fixture(scope="module")
def case():
    cache = {}

    def get(name, world):
        if (name, world) not in cache:
            model, inputs = autopar.zoo.get(name, **SIZES[name])
            best = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=world), pipeline=False)
            forced = split_plan(best)
            plans = {"autopar": best, "data_parallel": best.baselines["data_parallel"], "split_everything": forced}
            cache[name, world] = model, inputs, plans, reference_run(model, inputs)
        return cache[name, world]
    return get


def _check(rank, world, model, inputs, plan, ref):
    module = autopar.compile(model, inputs, plan=plan)
    check_module(rank, module, inputs, ref)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", sorted(SIZES))
@pytest.mark.parametrize("which", PLANS)
def test_compiled_zoo_model_trains_like_one_device(case, name, world, which):
    model, inputs, plans, ref = case(name, world)
    plan = plans[which]
    if which == "split_everything":  # the forced plan really splits beyond the batch
        assert any(any(s > 1 and d.reduction for d, s in zip(n.dims, plan.assignment[n.name].splits))
                   for n in plan.graph.nodes), "no reduction dim is split"
    run_threaded(_check, world, model, inputs, plan, ref)
