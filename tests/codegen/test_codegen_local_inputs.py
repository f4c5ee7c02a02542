"""``compile(..., inputs="local")``: each rank passes only its slice of the batch, as DDP users do.

The plan is made for the whole batch; a rank's slice is cut over the mesh axes where the first
reader of each input shards its batch axis (``module.data_parallel`` says which chunk it is).
Trained from slices, the module must still equal the single-device run on the whole batch."""


import pytest
import torch

import autopar
from tests.helpers.dist_utils import run_threaded
from tests.helpers.numerics import check_module, reference_run
from tests.helpers.plans import split_plan


def _check(rank, world, model, inputs, plan, ref):
    module = autopar.compile(model, inputs, plan=plan, inputs="local")
    args, kwargs = module.local_batch(*inputs)
    check_module(rank, module, inputs, ref, feed=args)
    if plan.baselines or plan.search.status == "fixed":  # data parallel: one slice for all inputs
        replicas, index = module.data_parallel
        assert replicas * args[0].shape[0] == inputs[0].shape[0]
        assert torch.equal(args[0], inputs[0].chunk(replicas)[index])
        return replicas, index
    return None


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("which", ["data_parallel", "split_everything"])
@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_training_on_local_slices_equals_one_device(name, which, world):
    sizes = {"mlp": dict(batch=8, inputs=8, hidden=16), "gpt": dict(layers=1, width=32, heads=4, seq=8, batch=8,
                                                                      vocab=64)}[name]
    model, inputs = autopar.zoo.get(name, **sizes)
    best = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=world), pipeline=False)
    plan = best.baselines["data_parallel"] if which == "data_parallel" else split_plan(best)
    slices = run_threaded(_check, world, model, inputs, plan, reference_run(model, inputs))
    if which == "data_parallel":  # every rank its own chunk of the whole batch
        assert sorted(i for _, i in slices) == list(range(world)) and {r for r, _ in slices} == {world}


def _wrong_size(rank, world, model, inputs, plan):
    module = autopar.compile(model, inputs, plan=plan, inputs="local")
    with pytest.raises(ValueError, match="this rank's slice of batch of shape"):
        module(*inputs)  # the whole batch where a slice is expected: one line, not a shape error deep inside


def test_a_whole_batch_where_a_slice_is_expected_is_one_line():
    model, inputs = autopar.zoo.get("mlp", batch=8, inputs=8, hidden=16)
    plan = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=2), pipeline=False).baselines["data_parallel"]
    run_threaded(_wrong_size, 2, model, inputs, plan)
