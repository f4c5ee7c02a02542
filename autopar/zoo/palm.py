"""A PaLM-style decoder (Chowdhery et al. 2022, section 2): what differs from ``gpt``.

* parallel block: ``y = x + attention(LN(x)) + MLP(LN(x))``, one layer norm shared by both;
* multi-query attention: ``heads`` query heads of ``head_dim``, one key and one value head shared
  by all (projected once, then expanded: a view, no copy), ``heads * head_dim`` need not equal
  the width (PaLM 540B: 48 x 256 = 12288 of 18432);
* SwiGLU MLP: ``w_out(silu(x W_gate) * x W_up)``, three weight matrices of ``width x ffn``;
* no biases (linears and layer norms), input and output embeddings shared.

Not modelled: rotary position embeddings (element-wise, a few FLOPs per token; the positions
here are implicit), the z-loss. ``attention="manual"`` materialises the scores (what a 2022 TPU
program does without a fused kernel); ``"sdpa"`` calls the fused kernel.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class ParallelBlock(nn.Module):
    def __init__(self, width: int, heads: int, head_dim: int, ffn: int, seq: int, manual: bool):
        super().__init__()
        self.heads, self.head_dim, self.ffn, self.manual = heads, head_dim, ffn, manual
        self.ln = nn.LayerNorm(width, bias=False)
        self.q = nn.Linear(width, heads * head_dim, bias=False)
        self.kv = nn.Linear(width, 2 * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, width, bias=False)
        self.w_in = nn.Linear(width, 2 * ffn, bias=False)  # gate and up projections, fused
        self.w_out = nn.Linear(ffn, width, bias=False)
        if manual:
            self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)))

    def forward(self, x):
        b, s, _ = x.shape
        h = self.ln(x)
        q = self.q(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).split(self.head_dim, dim=2)
        k = k.view(b, s, 1, self.head_dim).transpose(1, 2).expand(b, self.heads, s, self.head_dim)
        v = v.view(b, s, 1, self.head_dim).transpose(1, 2).expand(b, self.heads, s, self.head_dim)
        if self.manual:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            att = att.masked_fill(~self.mask[:s, :s], float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = self.o(y.transpose(1, 2).contiguous().view(b, s, self.heads * self.head_dim))
        gate, up = self.w_in(h).split(self.ffn, dim=2)
        return x + y + self.w_out(F.silu(gate) * up)


class PaLM(nn.Module):
    def __init__(self, vocab, width, heads, head_dim, ffn, layers, seq, manual):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(ParallelBlock(width, heads, head_dim, ffn, seq, manual)
                                    for _ in range(layers))
        self.ln = nn.LayerNorm(width, bias=False)

    def forward(self, idx, labels=None):
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln(x), self.tok.weight)  # shared input/output embedding
        if labels is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


def palm(batch=4, seq=64, width=128, heads=4, head_dim=32, ffn=512, layers=2, vocab=512,
         attention="manual", device="cpu", seed=0):
    if attention not in ("sdpa", "manual"):
        raise ValueError(f"attention must be 'sdpa' or 'manual', not {attention!r}")
    torch.manual_seed(seed)
    with torch.device(device):
        model = PaLM(vocab, width, heads, head_dim, ffn, layers, seq, attention == "manual")
        idx = torch.randint(0, vocab, (batch, seq))
        labels = torch.randint(0, vocab, (batch, seq))
    return model, (idx, labels)
