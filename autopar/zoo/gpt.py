"""A GPT-style decoder: token + position embeddings, pre-norm causal attention blocks, MLP, head.

``tie=True`` shares the token embedding with the output head (GPT-2 and Megatron-LM do).

``attention="sdpa"`` uses ``F.scaled_dot_product_attention(is_causal=True)``; ``"manual"`` writes
attention out as matmul, masked softmax and matmul, so both forms of attention are exercised.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, seq: int, manual: bool):
        super().__init__()
        self.heads = heads
        self.manual = manual
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        if manual:
            self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)))

    def forward(self, x):
        b, s, w = x.shape
        q, k, v = self.qkv(x).split(w, dim=2)
        q = q.view(b, s, self.heads, w // self.heads).transpose(1, 2)
        k = k.view(b, s, self.heads, w // self.heads).transpose(1, 2)
        v = v.view(b, s, self.heads, w // self.heads).transpose(1, 2)
        if self.manual:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(w // self.heads))
            att = att.masked_fill(~self.mask[:s, :s], float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, s, w)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, width: int, heads: int, seq: int, manual: bool):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads, seq, manual)
        self.ln2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, width: int, heads: int, layers: int, seq: int, manual: bool,
                 tie: bool = False):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads, seq, manual) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.tie = tie
        if not tie:
            self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx, labels=None):
        s = idx.shape[1]
        x = self.tok(idx) + self.pos.weight[:s]
        for block in self.blocks:
            x = block(x)
        h = self.ln(x)
        logits = F.linear(h, self.tok.weight) if self.tie else self.head(h)
        if labels is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


def gpt(batch=8, seq=64, width=128, heads=4, layers=2, vocab=512, attention="sdpa",
        device="cpu", seed=0, tie=False):
    if attention not in ("sdpa", "manual"):
        raise ValueError(f"attention must be 'sdpa' or 'manual', not {attention!r}")
    if width % heads:
        raise ValueError(f"width {width} must be divisible by heads {heads}")
    torch.manual_seed(seed)
    with torch.device(device):
        model = GPT(vocab, width, heads, layers, seq, attention == "manual", tie)
        idx = torch.randint(0, vocab, (batch, seq))
        labels = torch.randint(0, vocab, (batch, seq))
    return model, (idx, labels)
