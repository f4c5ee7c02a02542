"""PaSE's "small" Transformer (docs/pase.md §7.4): 6 encoder and 6 decoder layers.

Written with einsums the way PaSE's graph has them: Q, K and V come from ONE einsum over a stacked
(3, heads, width, d_k) weight followed by ``unbind``; cross-attention stacks (x, enc, enc) first;
attention, output projection and FFN are einsums; post-norm residual blocks; no biases, masks,
dropout or 1/sqrt(d_k) scaling (PaSE has none); the sinusoidal positional encoding is a buffer
added to both embeddings; the loss is cross entropy over the (batch, seq) positions.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def _param(*shape, fan_in: int) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape) / math.sqrt(fan_in))


def sinusoid(seq: int, width: int) -> torch.Tensor:
    pos = torch.arange(seq, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10000.0) / width))
    pe = torch.zeros(seq, width)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)
    return pe


class Attention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        dk = width // heads
        self.w_qkv = _param(3, heads, width, dk, fan_in=width)
        self.w_o = _param(heads, width, dk, fan_in=width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x, mem=None):
        if mem is None:
            qkv = torch.einsum("ble,shek->sbhlk", x, self.w_qkv)
        else:
            qkv = torch.einsum("sble,shek->sbhlk", torch.stack((x, mem, mem)), self.w_qkv)
        q, k, v = qkv.unbind(0)
        att = torch.softmax(torch.einsum("bhlk,bhmk->bhlm", q, k), dim=-1)
        o = torch.einsum("bhlm,bhmk->bhlk", att, v)
        o = torch.einsum("bhlk,hek->ble", o, self.w_o)
        return self.norm(x + o)


class FeedForward(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.w1 = _param(width, hidden, fan_in=width)
        self.w2 = _param(hidden, width, fan_in=hidden)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        h = F.relu(torch.einsum("ble,ef->blf", x, self.w1))
        return self.norm(x + torch.einsum("blf,fe->ble", h, self.w2))


class EncoderLayer(nn.Module):
    def __init__(self, width: int, heads: int, hidden: int):
        super().__init__()
        self.attn = Attention(width, heads)
        self.ffn = FeedForward(width, hidden)

    def forward(self, x):
        return self.ffn(self.attn(x))


class DecoderLayer(nn.Module):
    def __init__(self, width: int, heads: int, hidden: int):
        super().__init__()
        self.self_attn = Attention(width, heads)
        self.cross_attn = Attention(width, heads)
        self.ffn = FeedForward(width, hidden)

    def forward(self, x, enc):
        return self.ffn(self.cross_attn(self.self_attn(x), enc))


class Transformer(nn.Module):
    def __init__(self, seq: int, vocab: int, width: int, heads: int, hidden: int, layers: int):
        super().__init__()
        self.src_embed = nn.Embedding(vocab, width)
        self.tgt_embed = nn.Embedding(vocab, width)
        self.register_buffer("pos", sinusoid(seq, width))
        self.encoder = nn.ModuleList(EncoderLayer(width, heads, hidden) for _ in range(layers))
        self.decoder = nn.ModuleList(DecoderLayer(width, heads, hidden) for _ in range(layers))
        self.w_out = _param(width, vocab, fan_in=width)

    def forward(self, src, tgt, labels=None):
        x = self.src_embed(src) + self.pos
        for layer in self.encoder:
            x = layer(x)
        y = self.tgt_embed(tgt) + self.pos
        for layer in self.decoder:
            y = layer(y, x)
        logits = torch.einsum("ble,ev->blv", y, self.w_out)
        if labels is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def transformer(batch=64, seq=256, vocab=50000, width=512, heads=8, hidden=2048, layers=6,
                device="cpu", seed=0):
    if width % heads:
        raise ValueError(f"width {width} must be divisible by heads {heads}")
    torch.manual_seed(seed)
    with torch.device(device):
        model = Transformer(seq, vocab, width, heads, hidden, layers)
        src = torch.randint(0, vocab, (batch, seq))
        tgt = torch.randint(0, vocab, (batch, seq))
        labels = torch.randint(0, vocab, (batch, seq))
    return model, (src, tgt, labels)
