"""nn.GRU and nn.RNN: one ``gru`` / ``rnn`` node each (their forwards branch on tensors: fx could
not trace them, and every model using one fell back to torch.export, plan only). Only the batch
splits.

References: FlopCounterMode on the meta device for the FLOPs; a single-device training run for
the compiled module (loss, every gradient, every parameter after 3 AdamW steps).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import autopar
from tests.helpers.dist_utils import run_threaded
from tests.helpers.numerics import check_module, reference_run
from tests.helpers.plans import split_plan


CELLS = {"gru": lambda **kw: nn.GRU(8, 8, **kw), "rnn": lambda **kw: nn.RNN(8, 8, **kw),
         "rnn_relu": lambda **kw: nn.RNN(8, 8, nonlinearity="relu", **kw)}


class Tagger(nn.Module):
    def __init__(self, batch_first: bool = True, bidirectional: bool = False, layers: int = 2,
                 cell: str = "gru"):
        super().__init__()
        self.gru = CELLS[cell](num_layers=layers, batch_first=batch_first, bidirectional=bidirectional)
        self.fc = nn.Linear(16 if bidirectional else 8, 3)
        self.batch_first = batch_first

    def forward(self, x, y):
        out, h = self.gru(x if self.batch_first else x.transpose(0, 1))
        out = out if self.batch_first else out.transpose(0, 1)
        return F.cross_entropy(self.fc(out).flatten(0, 1), y.flatten()) + h.pow(2).mean()


VARIANTS = [(True, False, "gru"), (False, True, "gru"), (True, True, "rnn"), (False, False, "rnn_relu")]


def _inputs():
    return torch.randn(4, 5, 8), torch.randint(0, 3, (4, 5))


@pytest.mark.parametrize("batch_first, bidirectional, cell", VARIANTS)
def test_one_node_traced_by_fx_with_flop_counters_flops(batch_first, bidirectional, cell):
    with torch.device("meta"):
        model, inputs = Tagger(batch_first, bidirectional, cell=cell), _inputs()
    graph = autopar.trace(model, inputs, frontend="fx")
    with FlopCounterMode(display=False) as counter:
        model(*inputs)
    assert graph.flops == counter.get_total_flops()
    (node,) = [n for n in graph.nodes if n.op == cell.removesuffix("_relu")]
    assert [d.name for d in node.dims if d.splittable] == ["b"] and not graph.unsupported


def _check(rank, world, model, inputs, plan, ref):
    check_module(rank, autopar.compile(model, inputs, plan=plan), inputs, ref)


@pytest.mark.parametrize("batch_first, bidirectional, cell", VARIANTS)
@pytest.mark.parametrize("which", ["data_parallel", "split_everything"])
def test_compiled_recurrent_layers_train_like_one_device(batch_first, bidirectional, cell, which):
    torch.manual_seed(0)
    model, inputs = Tagger(batch_first, bidirectional, cell=cell), _inputs()
    best = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=4), pipeline=False)
    plan = best.baselines["data_parallel"] if which == "data_parallel" else split_plan(best)
    run_threaded(_check, 4, model, inputs, plan, reference_run(model, inputs))
