"""A mean cross-entropy whose ignored targets fall unevenly on the shards trains like one device.

The mean is over the counted targets of the whole batch (those not ``ignore_index``); each
shard's call averages over its own. A causal LM's shifted labels end in an ignored position, so a
sequence split puts it on the last shard alone, and a padded batch puts its padding anywhere.
The sharded run all-reduces the count (``op_fixes.counted_mean``) and the plan prices that
all-reduce (``cost_models.loss_count``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import autopar
from autopar.core.cluster import Cluster
from autopar.cost_models.collectives import predicted_collectives
from tests.helpers.dist_utils import run_threaded
from tests.helpers.numerics import check_rank, reference_run
from tests.helpers.plans import data_parallel


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 5)

    def forward(self, x, y):
        return F.cross_entropy(self.fc(x), y)


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
