"""Causal attention's query rows exchanged for balanced work (``codegen/causal_balance.py``).

On 2 and 4 gloo processes, each holding a contiguous ``1/c`` of the query rows and the whole
keys and values (as after context parallelism's K/V all-gather): the balanced call's output and
gradients equal one device's causal sdpa on those rows (float64), with ``is_causal`` and with an
explicit causal mask split by rows (HF's); and the work per rank is the same on every rank: the
true entries of the masks its local sdpa calls get (the contiguous split's masks,
``op_fixes.causal_mask``, give the last rank the most), and their FLOPs (torch's counter), each
chunk attending to the keys up to its last row: ``(2c + 1) / (4c)`` of the contiguous split's
masked call over every key.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from autopar.codegen.causal_balance import Balance
from autopar.codegen.op_fixes import causal_mask
from tests.helpers.dist_utils import run_gloo

L, H, E = 32, 2, 4


def _inputs():
    g = torch.Generator().manual_seed(0)
    q, k, v, up = (torch.randn(1, H, L, E, generator=g, dtype=torch.float64) for _ in range(4))
    return q, k, v, up


def _rank(rank, world):
    import torch.distributed as dist

    q, k, v, up = _inputs()
    rows = L // world
    mine = slice(rank * rows, (rank + 1) * rows)
    ref_q, ref_k, ref_v = (t.clone().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(ref_q, ref_k, ref_v, is_causal=True)
    ref.backward(up)
    counts = {}
    tril = torch.ones(L, L, dtype=torch.bool).tril()[None, None]
    for kind, kwargs in (("is_causal", {"is_causal": True}), ("mask", {"attn_mask": tril[..., mine, :]})):
        lq = q[..., mine, :].clone().requires_grad_()
        lk, lv = k.clone().requires_grad_(), v.clone().requires_grad_()
        seen, flops = [], []

        def sdpa(**kw):
            seen.append(int(kw["attn_mask"].sum()))
            with FlopCounterMode(display=False) as counter:
                out = F.scaled_dot_product_attention(**kw)
            flops.append(counter.get_total_flops())
            return out

        out = Balance(world, rank, dist.group.WORLD).call(sdpa, (lq, lk, lv), kwargs)
        out.backward(up[..., mine, :])
        torch.testing.assert_close(out, ref[..., mine, :], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lq.grad, ref_q.grad[..., mine, :], rtol=1e-12, atol=1e-12)
        for local, whole in ((lk.grad, ref_k.grad), (lv.grad, ref_v.grad)):  # partial sums over the ranks
            dist.all_reduce(local)
            torch.testing.assert_close(local, whole, rtol=1e-12, atol=1e-12)
        counts[kind] = (sum(seen), sum(flops))
    with FlopCounterMode(display=False) as counter:  # the contiguous split's local call, masked
        F.scaled_dot_product_attention(q[..., mine, :], k, v, attn_mask=tril[..., mine, :])
    counts["contiguous"] = counter.get_total_flops()
    return counts


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_balanced_causal_attention_is_exact_and_gives_every_rank_the_same_work(world):
    counts = run_gloo(_rank, world)
    q, k, v, _ = _inputs()
    rows = L // world
    contiguous = [int(causal_mask(None, (q[..., :rows, :], k, v), {"is_causal": True}, r * rows, rows)[1]
                      ["attn_mask"].sum()) for r in range(world)]
    total = L * (L + 1) // 2
    assert sum(contiguous) == total and contiguous[-1] > contiguous[0]  # unbalanced without the exchange
    for kind in ("is_causal", "mask"):
        entries = [c[kind][0] for c in counts]
        assert entries == [total // world] * world, (kind, entries, contiguous)
        work = [c[kind][1] for c in counts]  # FLOPs: keys up to each chunk's last row, (2c + 1) / (4c^2)
        assert len(set(work)) == 1 and work[0] == counts[0]["contiguous"] * (2 * world + 1) / (4 * world), work
