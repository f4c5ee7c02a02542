"""A mixture-of-experts classifier: residual blocks of a top-k router and routed SwiGLU experts.

Written for torch.fx: the router is plain ops (linear, softmax, topk, a sum), and the experts are
one module whose weights are stacked along the expert axis (``[experts, ...]``) and whose
``num_experts`` says how many, called as ``(tokens [t, h], top_k_index [t, k], top_k_weights
[t, k])``: the form autopar's ``moe_experts`` rule reads as one node (and transformers' experts
classes have), so the experts can be split over devices; ``listed=True`` writes them instead
as an ``nn.ModuleList`` of one module per expert (``ExpertList``), which autopar splits too. Every expert runs on its routed tokens
only, with no capacity limit (no token is dropped).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Experts(nn.Module):
    """``num_experts`` SwiGLU feed-forwards; token ``t`` goes through its ``k`` chosen experts and
    their outputs are summed with the router's weights."""

    def __init__(self, experts: int, width: int, hidden: int):
        super().__init__()
        self.num_experts = experts
        self.gate_up = nn.Parameter(torch.randn(experts, 2 * hidden, width) / width ** 0.5)
        self.down = nn.Parameter(torch.randn(experts, width, hidden) / hidden ** 0.5)

    def forward(self, x, top_k_index, top_k_weights):
        if x.is_meta:  # shapes only (tracing): which tokens an expert gets depends on the values
            return torch.empty_like(x)
        out = torch.zeros_like(x)
        for e in range(self.num_experts):  # every expert runs, on its tokens (none is an empty matmul)
            token, slot = torch.where(top_k_index == e)
            gate, up = F.linear(x[token], self.gate_up[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down[e]) * top_k_weights[token, slot, None]
            out = out.index_add(0, token, y.to(out.dtype))
        return out


class SwiGLU(nn.Module):
    """One expert as its own module (``ExpertList``'s entries)."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.gate_up = nn.Linear(width, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class ExpertList(nn.Module):
    """The same experts as ``Experts``, written by hand as most MoE code is: an ``nn.ModuleList``
    of one feed-forward module per expert, each run on the tokens routed to it and added into the
    output with the router's weight (``index_add``)."""

    def __init__(self, experts: int, width: int, hidden: int):
        super().__init__()
        self.num_experts = experts
        self.experts = nn.ModuleList(SwiGLU(width, hidden) for _ in range(experts))

    def forward(self, x, top_k_index, top_k_weights):
        if x.is_meta:  # shapes only (tracing)
            return torch.empty_like(x)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(top_k_index == e)
            y = expert(x[token]) * top_k_weights[token, slot, None]
            out = out.index_add(0, token, y.to(out.dtype))
        return out


class MoEBlock(nn.Module):
    def __init__(self, width: int, hidden: int, experts: int, top_k: int, listed: bool = False):
        super().__init__()
        self.top_k = top_k
        self.norm = nn.LayerNorm(width)
        self.router = nn.Linear(width, experts, bias=False)
        self.experts = (ExpertList if listed else Experts)(experts, width, hidden)

    def forward(self, x):
        b, s, w = x.shape
        h = self.norm(x).reshape(b * s, w)
        probs = self.router(h).softmax(dim=-1)
        weights, index = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return x + self.experts(h, index, weights).reshape(b, s, w)


class MoE(nn.Module):
    def __init__(self, width: int, hidden: int, experts: int, top_k: int, layers: int, classes: int,
                 listed: bool = False):
        super().__init__()
        self.blocks = nn.ModuleList(MoEBlock(width, hidden, experts, top_k, listed) for _ in range(layers))
        self.head = nn.Linear(width, classes)

    def forward(self, x, labels=None):
        for block in self.blocks:
            x = block(x)
        logits = self.head(x)
        if labels is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def moe(batch=8, seq=16, width=64, hidden=128, experts=8, top_k=2, layers=2, classes=16, device="cpu", seed=0,
        listed=False):
    """``listed``: the experts as a list of modules (``ExpertList``), not stacked weights."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = MoE(width, hidden, experts, top_k, layers, classes, listed)
        x = torch.randn(batch, seq, width)
        labels = torch.randint(0, classes, (batch, seq))
    return model, (x, labels)
