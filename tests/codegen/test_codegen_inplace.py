"""In-place calls and tensor constants in the sharded module, against one device.

``local_map`` hands a node views that autograd forbids writing into, so ``x.relu_()``,
``F.relu(x, inplace=True)`` and ``nn.ReLU(inplace=True)`` (torchvision's default) failed in every
compiled model (a residual block of torchvision's pattern is among the cases); a tensor built while tracing (``torch.arange`` in an index) was looked up on the
wrong module. Each model here trains 3 AdamW steps on 2 and 4 threaded ranks under data
parallelism and under a plan that splits every node as much as it can (``helpers/plans.py``),
and must match one device: loss, every gradient, every parameter.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autopar
from tests.helpers.dist_utils import run_threaded
from tests.helpers.models import ConstantIndex
from tests.helpers.numerics import check_module, reference_run
from tests.helpers.plans import split_plan


class InPlace(nn.Module):
    """Three spellings of an in-place activation, one ``add_``, and readers of the written alias."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x, y):
        h = self.fc1(x)
        h.relu_()  # the result node is unused: fc2 reads fc1's node, which must see the write
        g = self.fc2(h)
        g.add_(0.5)
        F.relu(g, inplace=True)
        out = self.fc3(g)
        self.act(out)  # reads out after the module wrote into it
        return F.mse_loss(out, y)


class ResidualBlocks(nn.Module):
    """torchvision's BasicBlock pattern: conv, batch norm, ``ReLU(inplace=True)``, ``out += identity``."""

    def __init__(self, c: int = 4):
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c)
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(c, 5)

    def forward(self, x, y):
        h = self.relu(self.bn(self.stem(x)))
        out = self.relu(self.b1(self.c1(h)))
        out = self.b2(self.c2(out))
        out += h
        out = self.relu(out)
        return F.cross_entropy(self.fc(out.mean((2, 3))), y)


MODELS = {"inplace": (InPlace, lambda: (torch.randn(8, 8), torch.randn(8, 4))),
          "constant_index": (ConstantIndex, lambda: (torch.randn(8, 8),)),
          "residual": (ResidualBlocks, lambda: (torch.randn(8, 3, 6, 6), torch.randint(0, 5, (8,))))}


def _check(rank, world, model, inputs, plan, ref):
    check_module(rank, autopar.compile(model, inputs, plan=plan), inputs, ref)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("which", ["data_parallel", "split_everything"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_compiled_module_trains_like_one_device(name, which, world):
    torch.manual_seed(0)
    make, inputs = MODELS[name]
    model, inputs = make(), inputs()
    best = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=world), pipeline=False)
    plan = best.baselines["data_parallel"] if which == "data_parallel" else split_plan(best)
    run_threaded(_check, world, model, inputs, plan, reference_run(model, inputs))


class Averaged(nn.Module):
    """``len(x)`` is no fx operation, so only torch.export traces this model."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(x).sum() / len(x)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("which", ["autopar", "data_parallel", "split_everything"])
def test_a_model_only_torch_export_traces_compiles_and_trains_like_one_device(which, world):
    """The export graph (ATen ops, parameters as placeholders) runs through the same codegen."""
    torch.manual_seed(0)
    model, inputs = Averaged(), (torch.randn(8, 8),)
    assert autopar.trace(model, inputs).fx_graph.meta.get("autopar_frontend") == "export"
    best = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=world), pipeline=False)
    plan = {"autopar": best, "data_parallel": best.baselines["data_parallel"],
            "split_everything": split_plan(best)}[which]
    run_threaded(_check, world, model, inputs, plan, reference_run(model, inputs))
