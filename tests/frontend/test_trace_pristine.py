"""Tracing leaves the user's model as it was, whatever its forward assigns, on every path.

``self.steps += 1`` on a buffer rebinds it, while torch.fx traces, to a Proxy: the buffer was
left holding it (and every later trace and call failed on it), and fx's graph would have read
the new value without ever writing the buffer. Now the model keeps its own tensor, fx refuses
the assignment in one line, and torch.export (which records it as an in-place add) traces it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autopar
from autopar import TraceError


class Stepper(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 2)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x, y):
        self.steps += 1
        return F.mse_loss(self.fc(x) * self.steps, y)


class Remembers(nn.Module):
    """Assigns a plain attribute and replaces a parameter's holder, then fails to trace anywhere."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 2)
        self.last = None

    def forward(self, x, y):
        self.last = x.sum()
        self.fc.extra = x
        if x.sum() > 0:  # data-dependent control flow: neither front end traces it
            return self.fc(x).sum()
        return self.fc(x).mean()


def _state(model):
    return {**{k: v for k, v in model.named_parameters()}, **{k: v for k, v in model.named_buffers()}}


@pytest.mark.parametrize("frontend", ["fx", "export", "auto"])
def test_a_buffer_rebound_in_forward_leaves_the_model_as_it_was(frontend):
    model, inputs = Stepper(), (torch.randn(4, 5), torch.randn(4, 2))
    before = _state(model)
    try:
        graph = autopar.trace(model, inputs, frontend=frontend)
    except TraceError as e:
        assert frontend == "fx" and "\n" not in str(e) and "steps" in str(e) and "in place" in str(e), str(e)
    else:
        assert frontend != "fx" and graph.frontend == "export"
    after = _state(model)
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
    assert type(model.steps) is torch.Tensor and int(model.steps) == 0
    with torch.no_grad():  # the user's model still runs as written
        assert float(model(*inputs)) == pytest.approx(float(F.mse_loss(model.fc(inputs[0]), inputs[1])))
    assert int(model.steps) == 1


def test_a_failed_trace_leaves_no_attribute_behind():
    model, inputs = Remembers(), (torch.randn(4, 5), torch.randn(4, 2))
    with pytest.raises(TraceError):
        autopar.trace(model, inputs)
    assert model.last is None and not hasattr(model.fc, "extra")
    assert set(vars(model.fc)) == set(vars(nn.Linear(5, 2)))
