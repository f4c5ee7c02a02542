"""A mean cross-entropy whose ignored targets fall unevenly on the shards trains like one device.

The mean is over the counted targets of the whole batch (those not ``ignore_index``); each
shard's call averages over its own. A causal LM's shifted labels end in an ignored position, so a
sequence split puts it on the last shard alone, and a padded batch puts its padding anywhere.
The sharded run all-reduces the count (``codegen/counted.py``), started as soon as the targets
exist and waited for at the loss, and the plan prices what the forward beside it leaves exposed
(``cost_models.loss_count``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import autopar
from autopar.codegen.counted import CountStart
from autopar.codegen.module import shard_module
from autopar.core.cluster import Cluster
from autopar.core.loss_lead import LEAD_FLOPS
from autopar.cost_models.analytic import AnalyticModel
from autopar.cost_models.collectives import predicted_collectives
from autopar.cost_models.loss_count import loss_count
from tests.helpers.dist_utils import run_threaded
from tests.helpers.numerics import check_rank, reference_run
from tests.helpers.plans import data_parallel


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 5)

    def forward(self, x, y):
        return F.cross_entropy(self.fc(x), y)


class LateTargets(nn.Module):
    """A language-model head: the targets' view is traced after the logits, right at the loss."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 5)

    def forward(self, x, y):
        logits = self.fc2(torch.relu(self.fc1(x)))
        return F.cross_entropy(logits.view(-1, 5), y.view(-1))


def _late_inputs():
    x, y = _inputs()
    return x.view(4, 2, 8).float(), y.view(4, 2)


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 8, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (8,), generator=g)
    y[:3] = -100  # 1 of 4 counted on the first shard of 2, 4 of 4 on the second
    return x, y


def test_ignored_targets_on_one_shard_train_like_one_device():
    torch.manual_seed(0)
    model, inputs = Classifier().double(), _inputs()
    graph = autopar.trace(model, inputs)
    plan = data_parallel(graph, (2,))
    run_threaded(check_rank, 2, model, inputs, graph, plan, (2,), reference_run(model, inputs))


def test_the_count_is_priced():
    model, inputs = Classifier(), _inputs()
    graph = autopar.trace(model, inputs)
    cluster = Cluster.preset("cpu", devices=2)
    pred = predicted_collectives(graph, data_parallel(graph, (2,)), cluster)
    loss = next(n.name for n in graph.nodes if n.op == "cross_entropy")
    counts = pred.of("loss-count", loss)
    assert len(counts) == 1 and counts[0].kind == "all-reduce" and counts[0].collective.p == 2


def test_uneven_ignored_targets_with_a_late_target_view_train_like_one_device():
    torch.manual_seed(0)
    model, inputs = LateTargets().double(), tuple(t.double() if t.is_floating_point() else t for t in _late_inputs())
    graph = autopar.trace(model, inputs)
    plan = data_parallel(graph, (2,))
    run_threaded(check_rank, 2, model, inputs, graph, plan, (2,), reference_run(model, inputs))


def _program_order(rank, world, model, graph, plan):
    program = shard_module(model, graph, plan, (world,)).program.module
    order = []
    for n in program.graph.nodes:
        if n.op == "call_module" and isinstance(program.get_submodule(n.target), CountStart):
            order.append("count")
        elif n.op in ("call_function", "call_module") and "linear" in str(n.target) + n.name:
            order.append("linear")
        elif "cross_entropy" == n.name:
            order.append("loss")
    return order


def test_the_count_starts_before_the_forward_that_follows_the_targets():
    """The targets' view sits after the logits in the traced graph; the program counts them and
    starts the all-reduce before the first linear, and the loss waits for it."""
    model, inputs = LateTargets(), _late_inputs()
    graph = autopar.trace(model, inputs)
    order = run_threaded(_program_order, 2, model, graph, data_parallel(graph, (2,)))[0]
    assert order == ["count", "linear", "linear", "loss"]


def test_the_lead_is_the_forward_the_targets_do_not_need():
    """The FLOPs recorded beside the loss are the two linears' (torch's FLOP counter), not the
    targets' view's."""
    model, inputs = LateTargets(), _late_inputs()
    with FlopCounterMode(display=False) as flops:
        model.fc2(torch.relu(model.fc1(inputs[0])))
    loss = next(n for n in autopar.trace(model, inputs).nodes if n.op == "cross_entropy")
    assert loss.attrs[LEAD_FLOPS] == flops.get_total_flops()


@pytest.mark.parametrize("lead", [0, 10**6, 10**12])
def test_the_count_is_charged_what_the_lead_leaves_exposed(lead):
    """The count's term is max(0, all-reduce - lead FLOPs / (devices * peak)): all of it with no
    lead, part of it behind a small one, none behind a large one."""
    model, inputs = LateTargets(), _late_inputs()
    graph = autopar.trace(model, inputs)
    loss = next(n for n in graph.nodes if n.op == "cross_entropy")
    loss.attrs[LEAD_FLOPS] = lead
    cluster = Cluster.preset("cpu", devices=2)
    cfg = data_parallel(graph, (2,))[loss.name]
    count = loss_count(loss, cfg, cluster.mesh(), cluster).seconds
    want = max(0.0, count - lead / (2 * max(cluster.peak_flops.values())))
    cm = AnalyticModel()
    term = next(t for t in cm.node_breakdown(loss, cfg, cluster).terms if t.label.startswith("loss's count"))
    assert term.seconds == pytest.approx(want)
    assert (want == 0.0) == (lead == 10**12) and (want == count) == (lead == 0)
    no_count = cm.node_breakdown(loss, cfg, cluster).seconds - term.seconds
    assert cm.node_cost(loss, [cfg], cluster)[0] == pytest.approx(no_count + want)
