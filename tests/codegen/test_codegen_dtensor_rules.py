"""Which of DTensor's own op rules give the right numbers (torch 2.13, 2 ranks), as a record.

Codegen never relies on these: every IR node runs through ``local_map`` with the plan's own
placements (``codegen/dtensor.py``), because some rules are wrong or missing. This test pins what
was found, so that a torch upgrade that changes a verdict shows up here:

* right: linear (batch, column, row -> Partial), conv2d batch split, vocab-split embedding
  (``_MaskPartial``), layer_norm / softmax over a split dim (gathered first), cross_entropy on a
  batch split (``Partial(avg)``);
* WRONG: conv2d with an in-channel split returns wrong values labelled ``Replicate``;
* raises: conv2d with an out-channel split; sdpa on CPU (flash kernel without a sharding rule),
  so attention heads could not run through DTensor at all.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.experimental import local_map

from tests.helpers.dist_utils import run_threaded


def conv(a, c):
    return F.conv2d(a, c, padding=1)


def causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def cases():
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    x, w, b, img, cw, q = r(4, 8), r(6, 8), r(6), r(2, 4, 5, 5), r(6, 4, 3, 3), r(2, 2, 8, 4)
    R, S0, S1, S2 = Replicate(), Shard(0), Shard(1), Shard(2)
    return {
        "linear batch": (F.linear, [x, w, b], [S0, R, R], "right"),
        "linear column": (F.linear, [x, w, b], [R, S0, S0], "right"),
        "linear row": (F.linear, [x, w, b], [S1, S1, R], "right"),
        "conv2d batch": (conv, [img, cw], [S0, R], "right"),
        "conv2d out-channel": (conv, [img, cw], [R, S0], "raises"),
        "conv2d in-channel": (conv, [img, cw], [S1, S1], "WRONG"),
        "embedding vocab": (F.embedding, [torch.randint(0, 10, (3, 4), generator=g), r(10, 8)],
                            [R, S0], "right"),
        "sdpa heads": (causal, [q, q.flip(2), q.flip(3)], [S1, S1, S1], "raises"),
        "sdpa query rows": (causal, [q, q.flip(2), q.flip(3)], [S2, R, R], "raises"),
        "layer_norm split features": (lambda a, s: F.layer_norm(a, (8,), s), [x, r(8)], [S1, S0],
                                      "right"),
        "softmax split dim": (lambda a: torch.softmax(a, dim=1), [x], [S1], "right"),
        "cross_entropy batch": (F.cross_entropy, [x, torch.randint(0, 8, (4,), generator=g)],
                                [S0, S0], "right"),
    }


def verdicts(rank, world, table):
    mesh = init_device_mesh("cpu", (world,))
    out = {}
    for name, (fn, tensors, placements, _) in table.items():
        expected = fn(*tensors)
        try:
            got = fn(*[distribute_tensor(t, mesh, [p]) for t, p in zip(tensors, placements)])
            out[name] = "right" if torch.allclose(got.full_tensor(), expected, rtol=1e-5,
                                                  atol=1e-5) else "WRONG"
        except (RuntimeError, NotImplementedError):
            out[name] = "raises"
    return out


def test_dtensor_rule_verdicts():
    table = cases()
    found = run_threaded(verdicts, 2, table)[0]
    assert found == {name: case[3] for name, case in table.items()}


def replicated_param_grads(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    found = {}
    for via_redistribute in (False, True):
        w = torch.nn.Parameter(distribute_tensor(torch.ones(3), mesh, [Replicate()]))
        x = distribute_tensor(torch.arange(12.0).view(4, 3), mesh, [Shard(0)])
        read = w.redistribute(mesh, [Replicate()]) if via_redistribute else w
        y = local_map(lambda a, b: (a * b).sum(), out_placements=[Partial()],
                      in_placements=([Shard(0)], [Replicate()]),
                      in_grad_placements=([Shard(0)], [Partial()]), device_mesh=mesh)(x, read)
        y.full_tensor().backward()
        found[via_redistribute] = (w.grad.placements, w.grad.full_tensor().tolist())
    return found


def test_replicated_parameter_gradients_need_the_redistribute():
    """A data-parallel read of a replicated parameter has a partial gradient. Handed to
    ``local_map`` directly, the parameter's ``.grad`` stays ``Partial`` (right sum, wrong layout
    for the optimizer); through a no-op ``redistribute`` to its own placements, the backward of
    that redistribute all-reduces it to ``Replicate``. Codegen reads every tensor that way."""
    found = run_threaded(replicated_param_grads, 2)[0]
    assert found[False] == ((Partial(),), [18.0, 22.0, 26.0])
    assert found[True] == ((Replicate(),), [18.0, 22.0, 26.0])
