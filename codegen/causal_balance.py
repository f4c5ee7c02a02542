"""Causal attention's work balanced over the ranks that split its query rows (context parallelism).

A causal sdpa whose query rows ``l`` are cut contiguously over ``c`` ranks gives rank ``i`` rows
``i s/c ..``: row r attends to r + 1 keys, so the last rank does ``(2c - 1) / c`` times the
average work. Llama 3's layout (Dubey et al. 2024, 3.3.2): the sequence in ``2c`` chunks, rank
``i`` holding chunks ``i`` and ``2c - 1 - i``, every rank the same work. The keys and values are
gathered whole anyway, so only the queries move: before the local sdpa an all-to-all over the
context group trades each rank's two contiguous chunks (``2i``, ``2i + 1``) for its balanced pair,
each of its two chunks attends to the keys up to its last row (the causal mask built from those
global rows; an explicit mask's rows travel with the queries), and after it the outputs travel
back the same way; both all-to-alls are differentiable (their
backward is the reverse exchange), so the gradients come back too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

from autopar.core.ir import Node


def owner(chunk: int, parts: int) -> int:
    """The rank holding ``chunk`` (of ``2 parts``) in the balanced layout."""
    return chunk if chunk < parts else 2 * parts - 1 - chunk


def balanced_rows(rank: int, parts: int, rows: int) -> torch.Tensor:
    """The global query rows of ``rank`` in the balanced layout (``rows`` per rank)."""
    half = rows // 2
    lo, hi = rank, 2 * parts - 1 - rank
    return torch.cat([torch.arange(lo * half, (lo + 1) * half), torch.arange(hi * half, (hi + 1) * half)])


@dataclass
class Balance:
    """One rank's part in a balanced causal sdpa: its chunk ``index`` of ``parts`` over ``group``."""

    parts: int
    index: int
    group: object  # the process group of the mesh axes cutting ``l``

    def _exchange(self, x: torch.Tensor, dim: int, back: bool) -> torch.Tensor:
        c, i = self.parts, self.index
        contiguous, balanced = [2 * i, 2 * i + 1], [i, 2 * c - 1 - i]
        mine, wanted = (balanced, contiguous) if back else (contiguous, balanced)
        where = (lambda k: k // 2) if back else (lambda k: owner(k, c))  # the rank a chunk goes to
        source = (lambda k: owner(k, c)) if back else (lambda k: k // 2)  # the rank a wanted chunk is on
        rows = x.movedim(dim, 0)
        half = rows.shape[0] // 2
        pieces = rows.split(half)
        order = sorted(range(2), key=lambda j: where(mine[j]))
        send_sizes, recv_sizes = [0] * c, [0] * c
        for k in mine:
            send_sizes[where(k)] += half
        for k in wanted:
            recv_sizes[source(k)] += half
        send = torch.cat([pieces[j] for j in order]).contiguous()
        got = wait_tensor(all_to_all_single_autograd(send, recv_sizes, send_sizes, self.group)).split(half)
        arrived = sorted(range(2), key=lambda j: source(wanted[j]))
        out = [None, None]
        for pos, j in enumerate(arrived):
            out[j] = got[pos]
        return torch.cat(out).movedim(0, dim)

    def to_balanced(self, x: torch.Tensor, dim: int = -2) -> torch.Tensor:
        if x.dtype == torch.bool:  # gloo moves no bools
            return self._exchange(x.to(torch.uint8), dim, False).bool()
        return self._exchange(x, dim, False)

    def from_balanced(self, x: torch.Tensor, dim: int = -2) -> torch.Tensor:
        return self._exchange(x, dim, True)

    def call(self, sdpa, args: tuple, kwargs: dict):
        """``sdpa(*args, **kwargs)`` on this rank's balanced query rows; its output in its own rows.
        Each of its two chunks attends to the keys up to its last row only (the later ones are
        masked): ``(2c + 1) / (4c^2)`` of the whole attention's work on every rank, where a
        contiguous split's rank i masks ``(4i + 3) / (4c^2)`` of it out of ``1 / c``."""
        names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale"]
        bound = dict(zip(names, args))
        bound.update(kwargs)
        q, k, v = bound["query"], bound["key"], bound["value"]
        rows = q.shape[-2]
        mask = bound.get("attn_mask")
        if bound.get("is_causal") and isinstance(mask, torch.Tensor):
            raise ValueError("sdpa with is_causal together with attn_mask: pass one of them")
        if isinstance(mask, torch.Tensor) and mask.dim() >= 2 and mask.shape[-2] == rows and rows > 1:
            mask = self.to_balanced(mask)
        elif isinstance(mask, torch.Tensor):
            mask = mask.expand(*mask.shape[:-2], rows, mask.shape[-1])
        q = self.to_balanced(q)
        half = rows // 2
        mine = balanced_rows(self.index, self.parts, rows).to(q.device)
        outs = []
        for j in range(2):
            sel = slice(j * half, (j + 1) * half)
            keys = int(mine[(j + 1) * half - 1]) + 1  # the keys up to this chunk's last row
            call = dict(bound, query=q[..., sel, :], is_causal=False)
            if isinstance(mask, torch.Tensor):
                part = mask[..., sel, :]
                if _admits(part[..., keys:]):  # not causal after all: every key
                    keys = k.shape[-2]
                call["attn_mask"] = part[..., :keys]
            else:
                call["attn_mask"] = torch.arange(keys, device=q.device)[None, :] <= mine[sel, None]
            call["key"], call["value"] = k[..., :keys, :], v[..., :keys, :]
            outs.append(sdpa(**call))
        return self.from_balanced(torch.cat(outs, dim=-2))


def _admits(mask: torch.Tensor) -> bool:
    """Does any entry of an attention mask let a query see its key (bool True, additive > -inf)?"""
    if mask.numel() == 0:
        return False
    return bool(mask.any()) if mask.dtype == torch.bool else bool((mask > float("-inf")).any())


__all__ = ["Balance", "balanced_rows", "owner"]
