"""Ring attention (``codegen/ring_attention.py``) against one device's sdpa.

On 2 and 4 gloo processes, each holding a contiguous ``1/c`` of the query, key and value rows
(as every node of a context-parallel plan holds its tokens): the ring's output and the
gradients of its queries, keys and values equal one device's sdpa on those rows (float64), for
causal attention by ``is_causal`` and by an explicit mask split by rows (Hugging Face's), for
an additive padding mask with no causal structure, and for grouped-query attention
(``enable_gqa``, one key/value head for two query heads). The K/V passed around the ring is
one chunk per hop: every rank sends ``c - 1`` chunks in the forward (counted on the
collective's calls).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autopar.codegen.ring_attention import Ring
from tests.helpers.dist_utils import run_gloo

L, H, E = 32, 2, 4


def _inputs(kv_heads: int = H):
    g = torch.Generator().manual_seed(0)
    q, up = (torch.randn(2, H, L, E, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(2, kv_heads, L, E, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v, up


def _cases():
    tril = torch.ones(L, L, dtype=torch.bool).tril()[None, None]
    pad = torch.zeros(2, 1, L, L, dtype=torch.float64)
    pad[0, ..., L - 5:] = float("-inf")  # the first sequence's last 5 keys are padding
    return {"is_causal": (H, {"is_causal": True}), "causal mask": (H, {"attn_mask": tril}),
            "padding mask": (H, {"attn_mask": pad}), "gqa": (1, {"is_causal": True, "enable_gqa": True})}


def _rank(rank, world):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    rows = L // world
    mine = slice(rank * rows, (rank + 1) * rows)
    hops = []
    for name, (kv_heads, kwargs) in _cases().items():
        q, k, v, up = _inputs(kv_heads)
        ref = [t.clone().requires_grad_() for t in (q, k, v)]
        expected = F.scaled_dot_product_attention(*ref, **kwargs)
        expected.backward(up)
        local = [t[..., mine, :].clone().requires_grad_() for t in (q, k, v)]
        kw = dict(kwargs)
        if "attn_mask" in kw:
            kw["attn_mask"] = kw["attn_mask"][..., mine, :]
        calls, permute = [], fc.permute_tensor
        fc.permute_tensor = lambda t, *a, **k: (calls.append(t.numel()), permute(t, *a, **k))[1]
        import autopar.codegen.ring_attention as ra
        ra.permute_tensor = fc.permute_tensor
        try:
            out = Ring(world, rank, dist.group.WORLD).call(None, tuple(local), kw)
            forward = list(calls)
            out.backward(up[..., mine, :])
        finally:
            fc.permute_tensor = ra.permute_tensor = permute
        torch.testing.assert_close(out, expected[..., mine, :], rtol=1e-12, atol=1e-12, msg=name)
        for got, whole in zip(local, ref):
            torch.testing.assert_close(got.grad, whole.grad[..., mine, :], rtol=1e-12, atol=1e-12, msg=name)
        hops.append((name, forward, local[1].numel() + local[2].numel()))
    return hops


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_ring_attention_equals_one_device_and_passes_one_chunk_per_hop(world):
    for hops in run_gloo(_rank, world):
        for name, forward, chunk in hops:
            assert forward == [chunk] * (world - 1), (name, forward, chunk)


def test_ring_attention_refuses_dropout():
    q = torch.zeros(1, 1, 4, 2)
    with pytest.raises(ValueError, match="dropout"):
        Ring(2, 0, None).call(None, (q, q, q), {"dropout_p": 0.1})
