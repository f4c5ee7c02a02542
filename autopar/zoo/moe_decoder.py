"""A mixture-of-experts decoder: top-k routed experts as stacked weights, an optional shared
expert, grouped-query or multi-head latent attention (MLA, DeepSeek-V2/V3).

The routed experts run on the tokens routed to them, not on every token: each sequence's
``seq * top_k`` assignments are dispatched (by gathers, so the batch dim stays visible to the
planner) into ``experts`` buffers of ``capacity`` slots, the experts' three matmuls run as one
batched einsum over the buffers (``bech,ehf->becf``: FLOPs ``2 * batch * experts * capacity *
hidden * ffn``), and the outputs are gathered back and summed with the gate weights. With
``capacity_factor=1`` the capacity is ``seq * top_k / experts``: the FLOPs are exactly those of
the routed tokens under uniform routing; assignments beyond an expert's capacity are dropped
(GShard's rule, per sequence). ``capacity_factor=experts/top_k`` makes every expert able to take
every token of its sequence: no token is dropped, the model computes what a dropless MoE does.

Rotary position embeddings are left out (elementwise, a negligible part of a step's FLOPs);
attention is causal. Presets ``deepseek_v3`` and ``mixtral_8x7b`` give the published shapes
(DeepSeek-V3 technical report, table 1 / its config.json; Mixtral of Experts, table 1).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class SwiGLU(nn.Module):
    def __init__(self, width: int, ffn: int):
        super().__init__()
        self.gate = nn.Linear(width, ffn, bias=False)
        self.up = nn.Linear(width, ffn, bias=False)
        self.down = nn.Linear(ffn, width, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class GQA(nn.Module):
    """Grouped-query attention (Mixtral, Llama): ``kv_heads`` key/value heads shared by groups."""

    def __init__(self, width: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, width // heads
        self.q = nn.Linear(width, heads * self.dim, bias=False)
        self.k = nn.Linear(width, kv_heads * self.dim, bias=False)
        self.v = nn.Linear(width, kv_heads * self.dim, bias=False)
        self.o = nn.Linear(heads * self.dim, width, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        rep = self.heads // self.kv_heads
        q = self.q(x).view(b, s, self.heads, self.dim).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv_heads, 1, self.dim).expand(b, s, self.kv_heads, rep, self.dim)
        v = self.v(x).view(b, s, self.kv_heads, 1, self.dim).expand(b, s, self.kv_heads, rep, self.dim)
        k = k.reshape(b, s, self.heads, self.dim).transpose(1, 2)
        v = v.reshape(b, s, self.heads, self.dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, self.heads * self.dim))


class MLA(nn.Module):
    """Multi-head latent attention: queries and keys/values through low-rank latents; a rope part
    of the key shared by every head (DeepSeek-V2 section 2.1)."""

    def __init__(self, width: int, heads: int, q_rank: int, kv_rank: int, nope: int, rope: int, v_dim: int):
        super().__init__()
        self.heads, self.nope, self.rope, self.v_dim, self.kv_rank = heads, nope, rope, v_dim, kv_rank
        self.q_a = nn.Linear(width, q_rank, bias=False)
        self.q_norm = RMSNorm(q_rank)
        self.q_b = nn.Linear(q_rank, heads * (nope + rope), bias=False)
        self.kv_a = nn.Linear(width, kv_rank + rope, bias=False)
        self.kv_norm = RMSNorm(kv_rank)
        self.kv_b = nn.Linear(kv_rank, heads * (nope + v_dim), bias=False)
        self.o = nn.Linear(heads * v_dim, width, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.heads
        q = self.q_b(self.q_norm(self.q_a(x))).view(b, s, h, self.nope + self.rope).transpose(1, 2)
        latent, k_rope = self.kv_a(x).split([self.kv_rank, self.rope], dim=-1)
        kv = self.kv_b(self.kv_norm(latent)).view(b, s, h, self.nope + self.v_dim).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k_rope = k_rope.view(b, 1, s, self.rope).expand(b, h, s, self.rope)
        k = torch.cat([k_nope, k_rope], dim=-1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, h * self.v_dim))


class Experts(nn.Module):
    """The routed experts' SwiGLU weights stacked along a leading expert axis; ``forward`` takes
    the dispatched buffers ``[batch, experts, capacity, width]``."""

    def __init__(self, experts: int, width: int, ffn: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(experts, width, ffn) / math.sqrt(width))
        self.w3 = nn.Parameter(torch.randn(experts, width, ffn) / math.sqrt(width))
        self.w2 = nn.Parameter(torch.randn(experts, ffn, width) / math.sqrt(ffn))

    def forward(self, xe):
        h = F.silu(torch.einsum("bech,ehf->becf", xe, self.w1)) * torch.einsum("bech,ehf->becf", xe, self.w3)
        return torch.einsum("becf,efh->bech", h, self.w2)


class MoE(nn.Module):
    """Router (softmax over experts, top-k, gates renormalised), dispatch by gathers, experts,
    combine; plus ``shared`` always-on experts (one SwiGLU of ``shared * ffn``)."""

    def __init__(self, width: int, experts: int, top_k: int, ffn: int, shared: int, seq: int,
                 capacity_factor: float):
        super().__init__()
        self.experts_n, self.top_k = experts, top_k
        self.capacity = max(1, min(seq * top_k, math.ceil(seq * top_k * capacity_factor / experts)))
        self.router = nn.Linear(width, experts, bias=False)
        self.experts = Experts(experts, width, ffn)
        self.shared = SwiGLU(width, shared * ffn) if shared else None

    def forward(self, x):
        b, s, w = x.shape
        E, k, C = self.experts_n, self.top_k, self.capacity
        gate, chosen = torch.topk(F.softmax(self.router(x), dim=-1), k, dim=-1)
        gate = gate / gate.sum(dim=-1, keepdim=True)
        flat = chosen.reshape(b, s * k)  # expert of each assignment (token-major)
        # every step below but the sort is elementwise, a reduction, a scan or a gather along the
        # batch: the planner sees the batch dim throughout and scales the dispatch with it
        ids = torch.arange(E, device=x.device)
        hit = (flat.unsqueeze(-1) == ids).to(torch.int64)  # [b, s*k, E]
        count = hit.sum(dim=1)  # assignments per expert
        start = torch.cumsum(count, dim=1) - count  # first sorted position of each expert
        rank = torch.gather(torch.cumsum(hit, dim=1) - 1, 2, flat.unsqueeze(-1)).squeeze(-1)  # place inside it
        order = torch.argsort(flat, dim=1, stable=True)  # assignments grouped by expert
        slot = torch.arange(C, device=x.device)
        src = start.unsqueeze(-1) + slot  # [b, E, C]: the sorted position filling each slot
        filled = slot < count.unsqueeze(-1)
        src = torch.where(filled, src, torch.zeros_like(src)).reshape(b, E * C)
        token = torch.div(torch.gather(order, 1, src), k, rounding_mode="floor")
        xe = torch.gather(x, 1, token.unsqueeze(-1).expand(b, E * C, w))
        xe = xe * filled.reshape(b, E * C, 1).to(x.dtype)
        ye = self.experts(xe.view(b, E, C, w)).reshape(b, E * C, w)
        ye = torch.cat([ye, torch.zeros_like(ye[:, :1])], dim=1)  # the slot of dropped assignments
        back = torch.where(rank < C, flat * C + rank, torch.full_like(rank, E * C))
        out = torch.gather(ye, 1, back.unsqueeze(-1).expand(b, s * k, w)).view(b, s, k, w)
        y = (out * gate.unsqueeze(-1).to(out.dtype)).sum(dim=2)
        return y + self.shared(x) if self.shared is not None else y


class Layer(nn.Module):
    def __init__(self, width: int, attention: nn.Module, mlp: nn.Module):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = RMSNorm(width), attention, RMSNorm(width), mlp

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class MoEDecoder(nn.Module):
    """Embedding, ``dense`` leading layers with a dense SwiGLU (``dense_layers``), then the MoE
    layers (``layers``), final norm, head, cross-entropy."""

    def __init__(self, vocab, width, layers, dense, heads, kv_heads, experts, top_k, ffn, dense_ffn, shared,
                 seq, capacity_factor, mla):
        super().__init__()

        def attention():
            return MLA(width, heads, **mla) if mla else GQA(width, heads, kv_heads)

        self.embed = nn.Embedding(vocab, width)
        self.dense_layers = nn.ModuleList(Layer(width, attention(), SwiGLU(width, dense_ffn)) for _ in range(dense))
        self.layers = nn.ModuleList(
            Layer(width, attention(), MoE(width, experts, top_k, ffn, shared, seq, capacity_factor))
            for _ in range(layers - dense))
        self.norm = RMSNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx, labels=None):
        x = self.embed(idx)
        for layer in self.dense_layers:
            x = layer(x)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.norm(x))
        if labels is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


def moe_decoder(batch=4, seq=32, width=64, layers=2, dense=0, heads=4, kv_heads=2, experts=8, top_k=2, ffn=128,
        dense_ffn=256, shared=0, vocab=256, capacity_factor=1.0, mla_q_rank=0, mla_kv_rank=0, mla_nope=0,
        mla_rope=0, mla_v_dim=0, device="cpu", seed=0):
    """A MoE decoder with the given sizes; MLA attention when ``mla_kv_rank`` > 0 (then
    ``mla_q_rank``, ``mla_nope``, ``mla_rope``, ``mla_v_dim`` give its ranks and head dims)."""
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k must be between 1 and experts ({experts}), not {top_k}")
    if not 0 <= dense <= layers:
        raise ValueError(f"dense (leading dense layers) must be between 0 and layers ({layers}), not {dense}")
    if not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be > 0, not {capacity_factor!r}")
    mla = None
    if mla_kv_rank:
        if not (mla_q_rank and mla_nope and mla_rope and mla_v_dim):
            raise ValueError("MLA attention needs mla_q_rank, mla_nope, mla_rope and mla_v_dim > 0")
        mla = dict(q_rank=mla_q_rank, kv_rank=mla_kv_rank, nope=mla_nope, rope=mla_rope, v_dim=mla_v_dim)
    elif width % heads or heads % kv_heads:
        raise ValueError(f"width {width} must be divisible by heads {heads}, and heads by kv_heads {kv_heads}")
    torch.manual_seed(seed)
    with torch.device(device):
        model = MoEDecoder(vocab, width, layers, dense, heads, kv_heads, experts, top_k, ffn, dense_ffn, shared,
                           seq, capacity_factor, mla)
        idx = torch.randint(0, vocab, (batch, seq))
        labels = torch.randint(0, vocab, (batch, seq))
    return model, (idx, labels)


def deepseek_v3(batch=4, seq=4096, layers=61, device="meta", seed=0):
    """DeepSeek-V3's shape: 61 layers (first 3 dense, ffn 18432), width 7168, 256 routed experts
    top-8 (expert ffn 2048) and 1 shared, MLA (128 heads; q rank 1536, kv rank 512, nope 128, rope
    64, v 128), vocabulary 129280."""
    return moe_decoder(batch=batch, seq=seq, width=7168, layers=layers, dense=min(3, layers), heads=128, kv_heads=128,
               experts=256, top_k=8, ffn=2048, dense_ffn=18432, shared=1, vocab=129280, mla_q_rank=1536,
               mla_kv_rank=512, mla_nope=128, mla_rope=64, mla_v_dim=128, device=device, seed=seed)


def mixtral_8x7b(batch=4, seq=4096, layers=32, device="meta", seed=0):
    """Mixtral 8x7B's shape: 32 layers, width 4096, 8 experts top-2 (ffn 14336), 32 heads / 8 kv
    heads, vocabulary 32000."""
    return moe_decoder(batch=batch, seq=seq, width=4096, layers=layers, heads=32, kv_heads=8, experts=8, top_k=2,
               ffn=14336, vocab=32000, device=device, seed=seed)
