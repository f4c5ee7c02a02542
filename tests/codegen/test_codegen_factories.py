"""Tensors a forward makes from its inputs' sizes: ``torch.zeros(x.shape[0], h)``, positions
``torch.arange(x.shape[1])``, a causal mask ``torch.ones(t, t).tril()``.

torch's factories take sizes, not tensors, so fx could not see a Proxy size: the trace fell back to
torch.export and such models could be planned but not compiled. They trace with fx now (the
factories are nodes autopar replicates) and must train like one device when compiled.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autopar
from tests.helpers.dist_utils import run_threaded
from tests.helpers.numerics import check_module, reference_run
from tests.helpers.plans import split_plan


class FromSizes(nn.Module):
    def __init__(self, vocab: int = 20, width: int = 16, seq: int = 6):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.fc, self.head = nn.Linear(width, width), nn.Linear(width, vocab)

    def forward(self, x, y):
        b, t = x.shape[0], x.shape[1]
        h = self.tok(x) + self.pos(torch.arange(t))
        h = self.fc(h) + torch.zeros(b, t, h.shape[-1])
        causal = torch.ones(t, t).tril() / torch.ones(t, t).tril().sum(-1, keepdim=True)
        h = causal @ h  # running mean over the earlier positions
        return F.cross_entropy(self.head(h).flatten(0, 1), y.flatten())


def _inputs():
    return torch.randint(0, 20, (4, 6)), torch.randint(0, 20, (4, 6))


def test_factories_with_sizes_from_inputs_trace_with_fx_and_leave_torch_as_it_was():
    zeros = torch.zeros
    graph = autopar.trace(FromSizes(), _inputs(), frontend="fx")
    assert torch.zeros is zeros
    made = {n.target for n in graph.nodes if n.name.startswith(("arange", "zeros", "ones"))}
    assert {"torch.arange", "torch.zeros", "torch.ones"} <= made, made


def _check(rank, world, model, inputs, plan, ref):
    check_module(rank, autopar.compile(model, inputs, plan=plan), inputs, ref)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("which", ["data_parallel", "split_everything"])
def test_compiled_model_with_factories_trains_like_one_device(world, which):
    torch.manual_seed(0)
    model, inputs = FromSizes(), _inputs()
    best = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=world), pipeline=False)
    plan = best.baselines["data_parallel"] if which == "data_parallel" else split_plan(best)
    run_threaded(_check, world, model, inputs, plan, reference_run(model, inputs))
