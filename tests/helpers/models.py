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


class PositionLookup(nn.Module):
    """Token embeddings plus a position table looked up at ``torch.arange(seq)`` (a weight view
    that reads a constant), an MLP, a cross-entropy loss."""

    def __init__(self, vocab=48, seq=12, width=24):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq, width)
        self.fc = nn.Linear(width, width)
        self.out = nn.Linear(width, vocab)

    def forward(self, idx, targets):
        positions = torch.arange(idx.shape[1])
        x = self.tok(idx) + self.pos(positions)
        logits = self.out(torch.tanh(self.fc(x)))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    @staticmethod
    def inputs(batch=6, seq=12, vocab=48):
        g = torch.Generator().manual_seed(3)
        return torch.randint(0, vocab, (batch, seq), generator=g), torch.randint(0, vocab, (batch, seq), generator=g)
