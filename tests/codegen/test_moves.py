"""The fast layout moves (codegen/moves.py) against DTensor's own redistribute, on a 2x2 mesh.

Every pair of placements of a 3-d tensor on both mesh axes, one axis changed or both: the local
shard ``move`` returns must be the one DTensor's redistribute gives, on every rank (the fast
c10d path where it applies, DTensor's where it does not; both must agree)."""

from __future__ import annotations

import itertools
import threading

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from autopar.codegen.moves import move
from tests.helpers.dist_utils import run_threaded

ONE_AXIS = [Replicate(), Partial(), Shard(0), Shard(1), Shard(2)]


def _cases():
    pairs = []
    for src in itertools.product(ONE_AXIS, repeat=2):
        for dst in itertools.product([Replicate(), Shard(0), Shard(1), Shard(2)], repeat=2):
            if src != dst:
                pairs.append((src, dst))
    return pairs


def _check(rank, world, whole, pairs):
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
    bad = []
    for src, dst in pairs:
        ref_in = distribute_tensor(whole, mesh, [Replicate(), Replicate()])
        if any(p.is_partial() for p in src):  # a partial value: each rank's term, summing to whole
            src_local = _local_of(whole, mesh, src, rank)
        else:
            src_local = ref_in.redistribute(mesh, src).to_local()
        want = DTensor.from_local(src_local, mesh, src, run_check=False).redistribute(mesh, dst).to_local()
        got = move(src_local, mesh, src, dst)
        if got.shape != want.shape or not torch.allclose(got, want, atol=1e-6):
            bad.append((src, dst))
    return bad


def _local_of(whole, mesh, src, rank):
    """This rank's term of a partial sum, cut by the shard axes: terms that add up to ``whole``."""
    coord = mesh.get_coordinate()
    t = whole.clone()
    for axis, p in enumerate(src):
        if p.is_shard():
            t = t.chunk(mesh.size(axis), p.dim)[coord[axis]]
    n_partial = sum(1 for p in src if p.is_partial())
    weights = [(coord[a] + 1.0) / 3.0 for a, p in enumerate(src) if p.is_partial()]  # (1 + 2) / 3 == 1
    w = 1.0
    for x in weights:
        w *= x
    return (t * w).contiguous() if n_partial else t.contiguous()


def test_every_fast_move_is_dtensors_on_a_2x2_mesh():
    torch.manual_seed(0)
    whole = torch.randn(4, 8, 12)  # every dim cut evenly by both axes (from_local assumes even shards)
    pairs = _cases()
    bad = run_threaded(_check, 4, whole, pairs)
    assert all(not b for b in bad), f"moves that differ from DTensor's redistribute: {bad[0][:5]}"


def _gather_one_long(rank, world, whole):
    mesh = init_device_mesh("cpu", (world,))
    src_local = distribute_tensor(whole, mesh, [Shard(2)]).to_local()  # dim 2 is 1 long here
    got = move(src_local, mesh, (Shard(2),), (Replicate(),))
    want = DTensor.from_local(src_local, mesh, [Shard(2)], run_check=False).redistribute(mesh, [Replicate()]).to_local()
    return torch.equal(got, want), got.is_contiguous(), tuple(got.view(4, 6, -1).shape)


def test_a_gather_on_a_dim_one_long_per_rank_is_contiguous_as_dtensors():
    # the quick gpt of cost_vs_measured (2 heads over 2 ranks, one each, then gathered) failed in a reader's
    # view: flatten of a 1-long dim is a view, so the gathered result came back strided
    whole = torch.randn(4, 6, 2, 8)
    for same, contiguous, viewed in run_threaded(_gather_one_long, 2, whole):
        assert same and contiguous and viewed == (4, 6, 16)


# moves on both axes that the cost model prices step by step (cost_models.comm.reshard_steps): the
# walk must run them as c10d calls, never through DTensor, and a sum over both axes as one all-reduce
WALKS = [((Partial(), Partial()), (Replicate(), Replicate()), 1),
         ((Partial(), Partial()), (Replicate(), Shard(0)), 1),
         ((Partial(), Partial()), (Shard(1), Replicate()), 1),
         ((Replicate(), Replicate()), (Shard(0), Shard(1)), 0),
         ((Shard(0), Partial()), (Replicate(), Replicate()), 1),
         ((Partial(), Shard(2)), (Shard(1), Replicate()), 0)]


def _walk(rank, world, whole, calls):
    from torch.distributed.tensor import DTensor as RealDTensor

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
    cases = []
    for src, dst, _ in WALKS:  # DTensor's answers first: only the moves' own calls are counted
        if any(p.is_partial() for p in src):
            src_local = _local_of(whole, mesh, src, rank)
        else:
            src_local = distribute_tensor(whole, mesh, [Replicate(), Replicate()]).redistribute(mesh, src).to_local()
        cases.append((src_local, RealDTensor.from_local(src_local, mesh, src, run_check=False).redistribute(mesh, dst).to_local()))
    me, bad = threading.get_ident(), []
    for (src, dst, _), (src_local, want) in zip(WALKS, cases):
        before = calls.count(me)
        got = move(src_local, mesh, src, dst)
        bad.append((got.shape != want.shape or not torch.allclose(got, want, atol=1e-6), calls.count(me) - before))
    return bad


def test_a_move_on_both_axes_walks_them_with_one_all_reduce_for_a_sum_over_both(monkeypatch):
    from autopar.codegen import moves

    class NoDTensor:
        @staticmethod
        def from_local(*a, **k):
            raise AssertionError("a walkable move went through DTensor")

    calls = []
    real = moves.dist.all_reduce

    def counted(t, *a, **k):
        calls.append(threading.get_ident())  # the rank's thread: each counts its own
        return real(t, *a, **k)

    torch.manual_seed(0)
    whole = torch.randn(4, 8, 12)
    monkeypatch.setattr(moves, "DTensor", NoDTensor)
    monkeypatch.setattr(moves.dist, "all_reduce", counted)
    per_rank = run_threaded(_walk, 4, whole, calls)
    for results in per_rank:
        assert [wrong for wrong, _ in results] == [False] * len(WALKS)
    # the all-reduces each rank made per move (a reduce-scatter is another call): one where a sum is
    # reduced to a replica, whether over one axis or both
    for results in per_rank:
        assert [n for _, n in results] == [n for _, _, n in WALKS]
