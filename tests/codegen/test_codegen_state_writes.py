"""In-place writes into buffers and activations are kept by the compiled module, or refused.

A forward that updates a buffer in place (an exponential average of a batch statistic, a call
counter) and reads it in the same step, and one that writes into an activation twice through a
chain (``h.mul_(2).add_(1)``), train 3 steps on 2 gloo processes and must match one device:
loss, gradients, parameters, and the buffers after the last step. The statistic is of a
batch-split activation, so the ranks must agree on its global value (the single device's), not
keep per-rank statistics. Both front ends' graphs (fx, and torch.export's ATen in-place ops),
data-parallel and split-everything plans; ``self.seen += n`` (torch.fx cannot record it: the
export graph). Writes that reach other tensors through views (into a view; into a tensor whose
earlier view is read after it) run in place where the program's views are true views (data
parallel), and are refused in one line naming the op where they are not (split by features).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autopar
from autopar.codegen.module import shard_module
from autopar.codegen.placements import LayoutError
from autopar.core.tables import Mesh
from tests.helpers.case_runs import case_ids, cases_fixture, check_case
from tests.helpers.dist_utils import run_threaded
from tests.helpers.plans import data_parallel, split_everything


class EmaOfFeatures(nn.Module):
    """A running average of the hidden features' batch mean, and a step counter, both read by the loss."""

    def __init__(self):
        super().__init__()
        self.inp, self.out = nn.Linear(6, 12), nn.Linear(12, 3)
        self.register_buffer("ema", torch.zeros(12))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x, y):
        h = torch.tanh(self.inp(x))
        self.ema.mul_(0.75).add_(0.25 * h.detach().mean(0))
        self.steps.add_(1)
        return F.mse_loss(self.out(h - self.ema) * self.steps, y)


class TwoLinear(nn.Module):
    """6 inputs -> 12 features -> 3 outputs: the layers the models below write through."""

    def __init__(self):
        super().__init__()
        self.inp, self.out = nn.Linear(6, 12), nn.Linear(12, 3)


class ChainedActivation(TwoLinear):
    """An activation written twice through the first write's result, then read."""

    def forward(self, x, y):
        h = self.inp(x)
        h.mul_(2.0).add_(1.0)
        return F.mse_loss(self.out(torch.relu(h)), y)


class AugmentedCounter(TwoLinear):
    """``self.seen += n``: torch.fx cannot record the rebinding, so torch.export traces it."""

    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x, y):
        self.seen += x.shape[0]
        return F.mse_loss(self.out(self.inp(x)) / self.seen, y)


class IntoAView(TwoLinear):
    """A write into a view: eager makes it visible in the tensor viewed."""

    def forward(self, x, y):
        h = self.inp(x)
        h[:, :4].mul_(2.0)  # eager: h's first 4 features doubled
        return F.mse_loss(self.out(h), y)


class ViewReadAfter(TwoLinear):
    """A view taken before a write into its base, read after it: eager makes the write visible in it."""

    def forward(self, x, y):
        h = self.inp(x)
        pairs = h.view(8, 6, 2)
        h.add_(1.0)  # eager: pairs sees it
        return F.mse_loss(self.out(pairs.flatten(1)), y)


MODELS = {"ema": EmaOfFeatures, "chained_activation": ChainedActivation, "augmented_counter": AugmentedCounter,
          "into_a_view": IntoAView, "view_read_after": ViewReadAfter}
FRONTENDS = {"augmented_counter": ("auto",)}
PLANS = {"into_a_view": ("data_parallel",), "view_read_after": ("data_parallel",)}  # split: refused, below
CASES = [(m, f, p) for m in sorted(MODELS) for f in FRONTENDS.get(m, ("fx", "export"))
         for p in PLANS.get(m, ("data_parallel", "split_everything"))]
CASES += [(m, FRONTENDS.get(m, ("fx",))[0], "searched") for m in sorted(MODELS)]  # autopar.compile, as a user calls it


def _model(name: str):
    torch.manual_seed(0)
    return MODELS[name](), (torch.randn(8, 6), torch.randn(8, 3))


def _trace(model, inputs, frontend):
    return autopar.trace(model, inputs, frontend=frontend)


trained = cases_fixture(CASES, _model, _trace)


@pytest.mark.dist
@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_in_place_writes_are_kept_and_train_like_one_device(trained, case):
    check_case(trained, case)


def test_the_buffers_are_written_once_per_step_with_the_global_statistic():
    """Independent of the numerics helper: the buffers after one step, by hand."""
    model, (x, y) = _model("ema")
    h = torch.tanh(model.inp(x)).detach()
    expected = 0.25 * h.mean(0)
    graph = autopar.trace(model, (x, y), frontend="fx")

    def one_step(rank, world):
        module = shard_module(model, graph, data_parallel(graph, (world,)), (world,))
        module(x, y).backward()
        return module.ema.full_tensor(), module.steps.full_tensor()

    for ema, steps in run_threaded(one_step, 2):
        torch.testing.assert_close(ema, expected)
        assert int(steps) == 1
    assert float(model.ema.abs().sum()) == 0.0 and int(model.steps) == 0  # the user's model as it was


@pytest.mark.parametrize("model", [IntoAView, ViewReadAfter])
def test_an_in_place_write_the_program_cannot_keep_is_refused_in_one_line(model):
    """Split by features, the view is no view of the written tensor's local shard in the program."""
    model, inputs = model(), (torch.randn(8, 6), torch.randn(8, 3))
    graph = autopar.trace(model, inputs, frontend="fx")

    def build(rank, world):
        with pytest.raises(LayoutError) as err:
            shard_module(model, graph, split_everything(graph, Mesh((world,))), (world,))
        return str(err.value)

    message = run_threaded(build, 2)[0]
    assert "\n" not in message and "in-place" in message and ("mul_" in message or "add_" in message), message
