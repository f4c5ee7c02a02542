"""Small models more than one test folder runs (the tracer's tests and codegen's)."""

from __future__ import annotations

import torch
import torch.nn as nn


class ConstantIndex(nn.Module):
    """A tensor made while tracing (``torch.arange``), stored on the fx module as a constant."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        return h[torch.arange(4), 1:5].pow(2).mean() + h.mean()
