"""A batch of another size than traced, the last one of an epoch (``DataLoader(drop_last=False)``):
the compiled module runs it (``codegen/batches.py``), split unevenly where the plan's data-parallel
degree does not divide it (``codegen/uneven.py``), and trains as one device does on the same
batches: every loss, the last step's gradients, the parameters after."""

import copy

import pytest
import torch

import autopar
from tests.helpers.dist_utils import run_gloo, run_threaded
from tests.helpers.numerics import ATOL, EPS, LR, PARAM_ATOL, RTOL, loss_of

GPT = dict(layers=1, width=32, heads=4, seq=8, batch=8, vocab=64)
# the traced batch, then smaller ones: 7 over 2 and 4 ranks (uneven), 3 over 4 (a rank with
# none of it), 1, 4 (even), and the traced size again
SIZES = (8, 7, 3, 1, 4, 8)


def _epoch(model, batches, feed=lambda b: b, train_step=False):
    """Train on ``batches``: the losses, the last step's gradients (whole) and the parameters after.
    ``train_step``: by the compiled module's ``train_step`` (its loss's sum deferred past the
    backward), else by ``loss.backward()``."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS)
    losses = []
    for batch in batches:
        opt.zero_grad()
        if train_step:
            loss = model.train_step(*feed(batch))
        else:
            loss = loss_of(model(*feed(batch)))
            loss.backward()
        losses.append(loss.detach().clone())
        grads = {n: _whole(p.grad) for n, p in model.named_parameters()}
        opt.step()
    return (losses, grads, {n: _whole(p.detach()) for n, p in model.named_parameters()},
            {n: _whole(b) for n, b in model.named_buffers()})


def _whole(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t.clone()


def _compare(rank, got, want):
    for step, (a, b) in enumerate(zip(got[0], want[0])):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=lambda m, s=step: f"rank {rank} step {s} loss: {m}")
    for n in want[1]:
        torch.testing.assert_close(got[1][n], want[1][n], rtol=RTOL, atol=ATOL, msg=lambda m, n=n: f"grad {n}: {m}")
        torch.testing.assert_close(got[2][n], want[2][n], rtol=RTOL, atol=PARAM_ATOL, msg=lambda m, n=n: f"{n}: {m}")


def _train(rank, world, model, inputs, plan, batches, want, frontend):
    module = autopar.compile(model, inputs, plan=plan)
    _compare(rank, _epoch(module, batches, train_step=frontend == "export"), want)
    return sorted(module._programs)


@pytest.mark.parametrize("frontend", ["fx", "export"])
@pytest.mark.parametrize("world", [2, 4])
def test_smaller_and_uneven_batches_train_as_one_device(world, frontend):
    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("gpt", **GPT)
    graph = autopar.trace(model, inputs, frontend=frontend)
    plan = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=world), graph=graph,
                        pipeline=False).baselines["data_parallel"]
    batches = [tuple(t[:n] for t in inputs) for n in SIZES]
    want = _epoch(copy.deepcopy(model), batches)
    built = run_threaded(_train, world, model, inputs, plan, batches, want, frontend)
    assert built == [[1, 3, 4, 7, 8]] * world  # one program per batch size, the traced one reused


def _train_local(rank, world, model, inputs, plan, batches, want):
    module = autopar.compile(model, inputs, plan=plan, inputs="local")
    _compare(rank, _epoch(module, batches, feed=lambda b: module.local_batch(*b)[0]), want)


def test_local_slices_of_a_smaller_batch_train_as_one_device():
    """``inputs="local"``: every rank passes an equal, smaller slice (a DistributedSampler's last batch)."""
    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("gpt", **GPT)
    plan = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=2), pipeline=False).baselines["data_parallel"]
    batches = [tuple(t[:n] for t in inputs) for n in (8, 4, 2)]
    run_threaded(_train_local, 2, model, inputs, plan, batches, _epoch(copy.deepcopy(model), batches))


def _train_or_refuse(rank, world, model, inputs, plan, batches, want):
    module = autopar.compile(model, inputs, plan=plan)
    try:
        _compare(rank, _epoch(module, batches), want)
    except ValueError as e:  # LayoutError is one
        return str(e)
    for n, b in module.named_buffers():  # batch-norm running statistics
        torch.testing.assert_close(b.full_tensor(), want[3][n], rtol=RTOL, atol=PARAM_ATOL, msg=lambda m, n=n: f"{n}: {m}")
    return None


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_plans_that_split_more_than_the_batch_train_or_refuse_in_one_line(name):
    """On a (2, 2) mesh with hidden units, heads and the vocabulary cut beside the batch: the MLP
    trains as one device on batches of 7 and 3; the gpt's plan moves its logits merged with the
    sequence (``view(b * s, v)``) across the mesh, which DTensor cannot cut by batch rows: refused."""
    
    from tests.helpers.plans import split_plan

    sizes = {"mlp": dict(batch=8, inputs=8, hidden=16), "gpt": GPT}[name]
    torch.manual_seed(0)
    model, inputs = autopar.zoo.get(name, **sizes)
    best = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=4), pipeline=False)
    plan = split_plan(best)
    batches = [tuple(t[:n] for t in inputs) for n in (8, 7, 3)]
    errors = run_threaded(_train_or_refuse, 4, model, inputs, plan, batches, _epoch(copy.deepcopy(model), batches))
    if name == "mlp":
        assert errors == [None] * 4
    else:
        assert all(e and "\n" not in e and "drop_last=True" in e for e in errors), errors


def _train_both_frontends(rank, world, model, inputs, batches, want):
    torch.set_num_threads(1)
    cluster = autopar.Cluster.preset("cpu", devices=world)
    for frontend in ("fx", "export"):  # planned on every rank alike (an exported graph does not pickle)
        graph = autopar.trace(model, inputs, frontend=frontend, progress=False)
        plan = autopar.plan(model, inputs, cluster, graph=graph, pipeline=False).baselines["data_parallel"]
        module = autopar.compile(model, inputs, plan=plan)
        _compare(rank, _epoch(module, batches), want)


@pytest.mark.slow
@pytest.mark.dist
def test_uneven_batches_on_four_gloo_processes():
    """The same on real processes (gloo's collectives, DTensor's padded uneven gathers): batches
    of 7 and 3 over 4 processes, the plan made on an fx graph and on an exported one."""
    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("gpt", **GPT)
    batches = [tuple(t[:n] for t in inputs) for n in (8, 7, 3)]
    run_gloo(_train_both_frontends, 4, model, inputs, batches, _epoch(copy.deepcopy(model), batches))


def test_batch_norm_statistics_over_uneven_rows():
    """A CNN's batch norms, data parallel on 4 ranks: statistics over the whole batch of 7, and of
    3 (one rank with no rows), as one device computes them; running statistics too."""
    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("cnn", batch=8, channels=4, image=8, blocks=1)
    plan = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=4), pipeline=False).baselines["data_parallel"]
    batches = [tuple(t[:n] for t in inputs) for n in (8, 7, 3)]
    errors = run_threaded(_train_or_refuse, 4, model, inputs, plan, batches, _epoch(copy.deepcopy(model), batches))
    assert errors == [None] * 4


def _dtensor_outputs(rank, world, model, inputs, plan, expected):
    module = autopar.compile(model, inputs, plan=plan, outputs="dtensor")
    torch.testing.assert_close(module(*(t[:4] for t in inputs)).full_tensor(), expected)
    with pytest.raises(ValueError, match="outputs='dtensor' with a batch of 7") as info:
        module(*(t[:7] for t in inputs))
    assert "\n" not in str(info.value)


def test_dtensor_outputs_of_an_uneven_batch_are_refused_in_one_line():
    """A smaller even batch runs; an uneven one would need DTensor outputs of uneven shards: refused."""
    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("mlp", batch=8, inputs=8, hidden=16)
    plan = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=2), pipeline=False).baselines["data_parallel"]
    # the plain model's output is taken before the ranks start: a rank's trace patches torch while
    # it runs (torch.fx), and the ranks here are threads of one process
    expected = model(*(t[:4] for t in inputs))
    run_threaded(_dtensor_outputs, 2, model, inputs, plan, expected)
