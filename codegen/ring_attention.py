"""Ring attention: context parallelism with each rank's keys and values kept in their chunk.

The all-gather variant (``causal_balance.Balance``) runs each rank's query rows against the whole
sequence's keys and values, gathered before the call and saved for the backward. The ring (Liu
et al. 2023, "Ring Attention with Blockwise Transformers") keeps each rank's K/V chunk where it
is and passes it on around the context group: in ``c`` steps every rank's queries meet every
chunk, one block of attention per step, the next chunk travelling while the block computes; the
blocks' outputs merge by their log-sum-exp (the online softmax). The backward runs the same ring
again, each chunk carrying its gradients back to its owner (``c`` more hops), so only the local
chunks, the output and its log-sum-exp are saved: one chunk in flight instead of the gathered
K/V.

Why not torch's own: ``torch.distributed.tensor.experimental.context_parallel`` dispatches the
CUDA kernels only (flash, memory-efficient, cuDNN): on CPU its sdpa stops at
``aten._scaled_dot_product_flash_attention_for_cpu`` with no sharding strategy; its ring
template also takes ``is_causal`` only (no explicit mask, as Hugging Face models pass) and its
options (rotation, float32 accumulation) are module globals. So the blocks here are plain
matmuls; the K/V hops are ``permute_tensor`` (c10d all_to_all_single to the next rank).

Causal work is balanced as in ``causal_balance``: queries, keys, values (and an explicit mask's
rows) go to the layout where rank ``i`` holds chunks ``i`` and ``2c - 1 - i`` of ``2c`` (those
exchanges are differentiable all-to-alls), the output comes back; each step computes only the
half-chunk pairs its mask admits (half of the four on every rank at every step).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch.distributed._functional_collectives import permute_tensor, wait_tensor
from torch.distributed.tensor import Shard

from autopar.core.ir import Node

from .causal_balance import Balance, balanced_rows
from .placements import NodeLayout

_NAMES = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]


@dataclass
class Ring:
    """One rank's part in ring attention: its chunk ``index`` of ``parts`` over ``group``."""

    parts: int
    index: int
    group: object  # the process group of the mesh axes cutting the sequence

    def call(self, sdpa, args: tuple, kwargs: dict):
        """``sdpa(*args, **kwargs)`` for this rank's query rows with its own keys' and values'
        chunk (the other chunks reach it around the ring); its output in its own rows. ``sdpa``
        is not called: the blocks are computed here (their log-sum-exp is needed)."""
        bound = dict(zip(_NAMES, args))
        bound.update(kwargs)
        q, k, v, mask = bound["query"], bound["key"], bound["value"], bound.get("attn_mask")
        if float(bound.get("dropout_p") or 0.0) > 0.0:
            raise ValueError("ring attention runs without attention dropout: set the attention's dropout to 0 "
                             "or plan context parallelism with K/V all-gathered")
        if bound.get("is_causal") and isinstance(mask, torch.Tensor):
            raise ValueError("sdpa with is_causal together with attn_mask: pass one of them")
        if k.shape[-2] != q.shape[-2] or q.shape[-2] % 2:
            raise ValueError(f"ring attention splits queries and keys alike into even chunks; got {q.shape[-2]} "
                             f"query and {k.shape[-2]} key rows on this rank")
        balance = Balance(self.parts, self.index, self.group)
        rows = q.shape[-2]
        if isinstance(mask, torch.Tensor):
            if mask.dim() >= 2 and mask.shape[-2] == rows and rows > 1:
                mask = balance.to_balanced(mask)
            else:
                mask = mask.expand(*mask.shape[:-2], rows, mask.shape[-1])
        scale = bound.get("scale") or 1.0 / math.sqrt(q.shape[-1])
        q, k, v = (balance.to_balanced(t) for t in (q, k, v))
        out = _RingFunction.apply(q, k, v, mask, bool(bound.get("is_causal")), float(scale), self)
        return balance.from_balanced(out)


def runs_ring(node: Node, layout: NodeLayout) -> bool:
    """Can this node run as ring attention: self-attention (as many keys as queries) with its
    query rows cut evenly, into an even number per rank, and no attention dropout."""
    parts = layout.split_counts.get("l", 1)
    return (node.op == "sdpa" and parts > 1 and "l" not in layout.uneven and node.dim("l").size == node.dim("m").size
            and node.dim("l").size % (2 * parts) == 0 and not node.attrs.get("dropout_p"))


def ring_layout(node: Node, layout: NodeLayout) -> NodeLayout:
    """The layout of an attention run as a ring (``runs_ring``): its keys and values read
    (and their gradients given back) cut along their positions ``m`` over the mesh axes that cut
    the query rows, as their producers hold them, instead of gathered whole."""
    axes = [a for a, d in enumerate(layout.axis_dims) if d == "l"]
    ins, grads = list(layout.inputs), list(layout.input_grads)
    for j in (1, 2):
        m = next(i for i, dims in enumerate(node.inputs[j].spec.axes) if "m" in dims)
        for lay in (ins, grads):
            pl = list(lay[j])
            for a in axes:
                pl[a] = Shard(m)
            lay[j] = tuple(pl)
    return dataclasses.replace(layout, inputs=tuple(ins), input_grads=tuple(grads))


def ring_layouts(graph, layouts: dict[str, NodeLayout]) -> dict[str, NodeLayout]:
    """``layouts`` (node name -> layout) with every attention that can run as a ring read as one."""
    return {n.name: ring_layout(n, layouts[n.name]) if runs_ring(n, layouts[n.name]) else layouts[n.name]
            for n in graph.nodes}


def _repeat(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Keys or values with the heads of the queries ``like`` (grouped-query attention's ``enable_gqa``)."""
    if t.dim() < 3 or like.dim() < 3 or t.shape[-3] == like.shape[-3]:
        return t
    return t.repeat_interleave(like.shape[-3] // t.shape[-3], dim=-3)


def _fold(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A gradient of ``_repeat(like)`` summed back onto ``like``'s heads (and broadcast batch dims)."""
    if grad.dim() >= 3 and like.dim() >= 3 and grad.shape[-3] != like.shape[-3]:
        g = like.shape[-3]
        grad = grad.unflatten(-3, (g, grad.shape[-3] // g)).sum(-3)
    while grad.dim() > like.dim():
        grad = grad.sum(0)
    wide = [i for i, (a, b) in enumerate(zip(grad.shape, like.shape)) if b == 1 and a != 1]
    return grad.sum(wide, keepdim=True) if wide else grad


class _RingFunction(torch.autograd.Function):
    """The ring over balanced chunks: forward blocks merged by log-sum-exp, backward by the
    flash-attention gradient formulas per block (``P = exp(S - lse)``, ``dS = P (dP - D)``)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, causal: bool, scale: float, ring: Ring):
        acc = torch.promote_types(q.dtype, torch.float32)
        out = torch.zeros(q.shape[:-1] + v.shape[-1:], dtype=acc, device=q.device)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc, device=q.device)
        for step, (kc, vc, blocks) in enumerate(_steps(ring, q, (k, v), mask, causal)):
            for qs, ks, m in blocks:
                s = _scores(q[..., qs, :], _repeat(kc[..., ks, :], q), m, scale, acc)
                blse = torch.logsumexp(s, dim=-1)
                p = torch.exp(s - _finite(blse)[..., None])
                bout = p @ _repeat(vc[..., ks, :], q).to(acc)
                new = torch.logaddexp(lse[..., qs], blse)
                safe = _finite(new)
                out[..., qs, :] = (out[..., qs, :] * torch.exp(lse[..., qs] - safe)[..., None]
                                   + bout * torch.exp(blse - safe)[..., None])
                lse[..., qs] = new
        ctx.save_for_backward(q, k, v, out, lse, *([mask] if isinstance(mask, torch.Tensor) else []))
        ctx.causal, ctx.scale, ctx.ring = causal, scale, ring
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, *rest = ctx.saved_tensors
        mask = rest[0] if rest else None
        ring, scale = ctx.ring, ctx.scale
        acc = out.dtype
        dout = dout.to(acc)
        delta = (dout * out).sum(-1)
        dq = torch.zeros_like(q, dtype=acc)
        grads = [torch.zeros_like(k, dtype=acc), torch.zeros_like(v, dtype=acc)]
        for step, (kc, vc, blocks) in enumerate(_steps(ring, q, (k, v), mask, ctx.causal)):
            if step:  # this chunk's gradients so far, from the rank it was at before
                grads = _receive(grads)
            dk, dv = (torch.zeros_like(g) for g in grads)
            for qs, ks, m in blocks:
                kb, vb = _repeat(kc[..., ks, :], q).to(acc), _repeat(vc[..., ks, :], q).to(acc)
                s = _scores(q[..., qs, :], kb, m, scale, acc)
                p = torch.exp(s - _finite(lse[..., qs])[..., None])
                dv[..., ks, :] += _fold(p.transpose(-1, -2) @ dout[..., qs, :], vc[..., ks, :])
                ds = p * (dout[..., qs, :] @ vb.transpose(-1, -2) - delta[..., qs, None])
                dq[..., qs, :] += (ds @ kb) * scale
                dk[..., ks, :] += _fold(ds.transpose(-1, -2) @ q[..., qs, :].to(acc) * scale, kc[..., ks, :])
            grads = _send(ring, [grads[0] + dk, grads[1] + dv])  # on to the next rank; home after c hops
        dk, dv = _receive(grads)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def _steps(ring: Ring, q: torch.Tensor, kv: tuple, mask, causal: bool):
    """Per ring step: the K/V chunk this rank holds (its own first, then its predecessor's, ...)
    and the blocks to compute with it: (query rows, key rows, mask block) of each pair of half
    chunks the mask admits. The next chunk is on its way while the caller computes."""
    c, i = ring.parts, ring.index
    rows = q.shape[-2]
    half = rows // 2
    mine = balanced_rows(i, c, rows).to(q.device)
    pending = None
    for step in range(c):
        if step:
            kv = _receive(pending)
        if step < c - 1:
            pending = _send(ring, list(kv))
        source = (i - step) % c
        keys = balanced_rows(source, c, rows).to(q.device)
        blocks = []
        for a in range(2):
            qs = slice(a * half, (a + 1) * half)
            for b in range(2):
                ks = slice(b * half, (b + 1) * half)
                if isinstance(mask, torch.Tensor):
                    m = mask[..., qs, :].index_select(-1, keys[ks])
                    admitted = bool(m.any()) if m.dtype == torch.bool else bool((m > float("-inf")).any())
                elif causal:
                    m = keys[None, ks] <= mine[qs, None]
                    admitted = bool(m.any())
                    m = None if bool(m.all()) else m
                else:
                    m, admitted = None, True
                if admitted:
                    blocks.append((qs, ks, m))
        yield kv[0], kv[1], blocks


def _scores(q: torch.Tensor, k: torch.Tensor, mask, scale: float, acc: torch.dtype) -> torch.Tensor:
    s = (q.to(acc) @ k.to(acc).transpose(-1, -2)) * scale
    if mask is None:
        return s
    if mask.dtype == torch.bool:
        return s.masked_fill(~mask, float("-inf"))
    return s + mask.to(acc)


def _finite(x: torch.Tensor) -> torch.Tensor:
    """``x`` with -inf (a row no key of the block reaches) as 0, so that its weights are exp(-inf) = 0."""
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def _send(ring: Ring, tensors: list[torch.Tensor]):
    """Start passing ``tensors`` (one flat buffer) to the next rank of the ring; what arrives is
    the previous rank's."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dst = [(r + 1) % ring.parts for r in range(ring.parts)]
    return permute_tensor(flat, dst, ring.group), [(t.shape, t.dtype) for t in tensors]


def _receive(pending) -> list[torch.Tensor]:
    buffer, shapes = pending
    buffer = wait_tensor(buffer)
    out, at = [], 0
    for shape, dtype in shapes:
        n = math.prod(shape)
        out.append(buffer[at:at + n].view(shape).to(dtype))
        at += n
    return out


__all__ = ["Ring", "ring_layout", "ring_layouts", "runs_ring"]
