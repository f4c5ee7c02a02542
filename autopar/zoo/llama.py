"""A Llama-style decoder (Llama 2/3): what differs from ``gpt``.

* RMSNorm (no mean, no bias) before attention and before the MLP;
* grouped-query attention: ``heads`` query heads, ``kv_heads`` key/value heads each shared by
  ``heads // kv_heads`` query heads: the fused kernel takes the groups as they are
  (``enable_gqa``, as flash attention does: keys and values kept at ``kv_heads``), the written-out
  attention expands them to every query head (a copy, as Hugging Face's ``repeat_kv``);
* rotary position embeddings on queries and keys (cos/sin tables as buffers, rotate-half form);
* SwiGLU MLP: ``w2(silu(x w1) * x w3)``, three weight matrices of ``width x ffn``;
* no biases, separate (untied) input embedding and output head.

``attention="sdpa"`` calls the fused kernel (what torchtitan and the Llama 3 training run);
``"manual"`` writes the scores out.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_tables(seq: int, head_dim: int, theta: float = 500000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ang = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, kv_heads: int, seq: int, manual: bool):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.manual = heads, kv_heads, width // heads, manual
        self.wq = nn.Linear(width, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, width, bias=False)
        cos, sin = rotary_tables(seq, self.head_dim)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)
        if manual:
            self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)))

    def forward(self, x):
        b, s, _ = x.shape
        hd, rep = self.head_dim, self.heads // self.kv_heads
        q = self.wq(x).view(b, s, self.heads, hd).transpose(1, 2)
        k = self.wk(x).view(b, s, self.kv_heads, hd).transpose(1, 2)
        v = self.wv(x).view(b, s, self.kv_heads, hd).transpose(1, 2)
        cos, sin = self.cos[:s], self.sin[:s]
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if self.manual:
            k = k[:, :, None].expand(b, self.kv_heads, rep, s, hd).reshape(b, self.heads, s, hd)
            v = v[:, :, None].expand(b, self.kv_heads, rep, s, hd).reshape(b, self.heads, s, hd)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            att = att.masked_fill(~self.mask[:s, :s], float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=rep > 1)
        return self.wo(y.transpose(1, 2).contiguous().view(b, s, self.heads * hd))


class Block(nn.Module):
    def __init__(self, width, heads, kv_heads, ffn, seq, manual):
        super().__init__()
        self.attention_norm = RMSNorm(width)
        self.attention = Attention(width, heads, kv_heads, seq, manual)
        self.ffn_norm = RMSNorm(width)
        self.w1 = nn.Linear(width, ffn, bias=False)
        self.w3 = nn.Linear(width, ffn, bias=False)
        self.w2 = nn.Linear(ffn, width, bias=False)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, vocab, width, heads, kv_heads, ffn, layers, seq, manual):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads, kv_heads, ffn, seq, manual) for _ in range(layers))
        self.norm = RMSNorm(width)
        self.output = nn.Linear(width, vocab, bias=False)

    def forward(self, idx, labels=None):
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x)
        logits = self.output(self.norm(x))
        if labels is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


# Llama 3 shapes (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3): layers, width, ffn,
# heads, key/value heads; vocabulary 128,256 for all three.
LLAMA3 = {"8b": (32, 4096, 14336, 32, 8), "70b": (80, 8192, 28672, 64, 8), "405b": (126, 16384, 53248, 128, 8)}


def llama(batch=4, seq=64, width=128, heads=4, kv_heads=2, ffn=344, layers=2, vocab=512, attention="sdpa",
          device="cpu", seed=0):
    if attention not in ("sdpa", "manual"):
        raise ValueError(f"attention must be 'sdpa' or 'manual', not {attention!r}")
    if width % heads or heads % kv_heads:
        raise ValueError(f"width {width} must be divisible by heads {heads}, and heads by kv_heads {kv_heads}")
    torch.manual_seed(seed)
    with torch.device(device):
        model = Llama(vocab, width, heads, kv_heads, ffn, layers, seq, attention == "manual")
        idx = torch.randint(0, vocab, (batch, seq))
        labels = torch.randint(0, vocab, (batch, seq))
    return model, (idx, labels)


def llama3(size: str = "8b", batch=64, seq=8192, vocab=128256, attention="sdpa", device="meta", seed=0, layers=None):
    """A Llama 3 shape (``size`` one of ``LLAMA3``) on meta by default; ``layers`` overrides the depth."""
    if size not in LLAMA3:
        raise ValueError(f"size must be one of {', '.join(LLAMA3)}, not {size!r}")
    n, width, ffn, heads, kv = LLAMA3[size]
    return llama(batch=batch, seq=seq, width=width, heads=heads, kv_heads=kv, ffn=ffn, layers=layers or n,
                 vocab=vocab, attention=attention, device=device, seed=seed)
