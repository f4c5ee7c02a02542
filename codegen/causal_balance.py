"""Causal attention's work balanced over the ranks that split its query rows (context parallelism).

A causal sdpa whose query rows ``l`` are cut contiguously over ``c`` ranks gives rank ``i`` rows
``i s/c ..``: row r attends to r + 1 keys, so the last rank does ``(2c - 1) / c`` times the
average work. Llama 3's layout (Dubey et al. 2024, 3.3.2): the sequence in ``2c`` chunks, rank
``i`` holding chunks ``i`` and ``2c - 1 - i``, every rank the same work. The keys and values are
gathered whole anyway, so only the queries move: before the local sdpa an all-to-all over the
context group trades each rank's two contiguous chunks (``2i``, ``2i + 1``) for its balanced pair,
the causal mask is built from those global rows (an explicit mask's rows travel with the queries),
and after it the outputs travel back the same way; both all-to-alls are differentiable (their
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
        """``sdpa(*args, **kwargs)`` on this rank's balanced query rows; its output in its own rows."""
        names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale"]
        bound = dict(zip(names, args))
        bound.update(kwargs)
        q, k = bound["query"], bound["key"]
        rows = q.shape[-2]
        bound["query"] = self.to_balanced(q)
        mask = bound.get("attn_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() >= 2 and mask.shape[-2] == rows and rows > 1:
            bound["attn_mask"] = self.to_balanced(mask)
        if bound.get("is_causal"):
            if isinstance(mask, torch.Tensor):
                raise ValueError("sdpa with is_causal together with attn_mask: pass one of them")
            mine = balanced_rows(self.index, self.parts, rows).to(q.device)
            bound["attn_mask"] = torch.arange(k.shape[-2], device=q.device)[None, :] <= mine[:, None]
            bound["is_causal"] = False
        return self.from_balanced(sdpa(**bound))


__all__ = ["Balance", "balanced_rows", "owner"]
