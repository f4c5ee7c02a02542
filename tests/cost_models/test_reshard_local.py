"""A reshard step costs more than its bare collective: the runtime's path per step and the copy of
the collective's buffer around it (``alpha_beta.reshard_local``, fitted by ``reshard_fit``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autopar.cost_models.comm import reshard_cost, reshard_steps
from autopar.cost_models.reshard_fit import fit_moves
from autopar.core.cluster import Cluster
from autopar.core.layout import Partial, Replicate, Shard
from autopar.runtime.launch import launch
from tests.helpers.copies import CopiedBytes
from tests.helpers.dist_utils import run_threaded

BARE = Cluster.preset("cpu", devices=2)
CALL, PLAIN, STRIDED = 1e-4, 1e-10, 2.5e-10
MOVES = dataclasses.replace(BARE, move_call=CALL, copy_time=PLAIN, strided_copy_time=STRIDED)
SHAPE = (64, 32, 256)  # a (batch, seq, width) activation
NBYTES = 64 * 32 * 256 * 4


@pytest.mark.parametrize("src, dst, copied, rate", [
    ((Shard(2),), (Replicate(),), NBYTES, STRIDED),  # the gathered tensor, blocks put side by side
    ((Partial(),), (Replicate(),), NBYTES, PLAIN),  # the all-reduced input, cloned
    # the reduce-scatter's input, blocks stacked, and gloo's copy of its result out
    ((Partial(),), (Shard(2),), NBYTES, STRIDED + PLAIN / 2),
    ((Shard(1),), (Shard(2),), NBYTES, STRIDED),  # gloo: a gather of the whole tensor, a block kept
])
def test_a_reshard_costs_its_collective_plus_its_call_and_the_copy_of_its_buffer(src, dst, copied, rate):
    mesh = BARE.mesh()
    bare = reshard_cost(NBYTES, src, dst, mesh, BARE)
    assert bare > 0
    assert reshard_cost(NBYTES, src, dst, mesh, MOVES) == pytest.approx(bare + CALL + copied * rate, rel=1e-12)
    (step,) = reshard_steps(NBYTES, src, dst, mesh, MOVES)
    assert step.local == pytest.approx(CALL + copied * rate) and "local" in step.formula()


def test_a_local_slice_costs_its_call_and_the_copy_of_its_block_and_no_collective():
    mesh = BARE.mesh()
    assert reshard_cost(NBYTES, (Replicate(),), (Shard(2),), mesh, BARE) == 0.0
    assert reshard_cost(NBYTES, (Replicate(),), (Shard(2),), mesh, MOVES) == pytest.approx(
        CALL + NBYTES / 2 * STRIDED, rel=1e-12)
    assert reshard_steps(NBYTES, (Replicate(),), (Shard(2),), mesh, MOVES) == []  # nothing to count
    assert reshard_cost(NBYTES, (Shard(2),), (Shard(2),), mesh, MOVES) == 0.0


def _count_copies(rank, world, cases):
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Partial as P, Replicate as R, Shard as S

    from autopar.codegen.moves import move

    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    out = []
    for s, d in cases:
        src, dst = (P() if s == "P" else R() if s == "R" else S(s),), (R() if d == "R" else S(d),)
        shape = list(SHAPE)
        if isinstance(s, int):
            shape[s] //= world
        x = torch.randn(shape)
        with CopiedBytes() as c:
            move(x, mesh, src, dst)
        out.append(c.nbytes)
    return out


def test_the_priced_copy_is_what_the_runtime_s_move_copies():
    """The bytes ``reshard_local`` prices as copied, against the runtime's own copies counted op by
    op on 2 ranks: the model's byte count is independent of it."""
    cases = [(2, "R"), ("P", "R"), ("P", 2), (1, "R"), ("R", 2)]
    counted = launch(_count_copies, 2, cases)  # gloo: its collectives' own copies run in C++
    assert counted[0] == counted[1]
    mesh = BARE.mesh()
    even = dataclasses.replace(MOVES, copy_time=PLAIN, strided_copy_time=PLAIN)  # a byte is a byte
    for (s, d), got in zip(cases, counted[0]):
        src = (Partial(),) if s == "P" else (Replicate(),) if s == "R" else (Shard(s),)
        dst = (Replicate(),) if d == "R" else (Shard(d),)
        priced = (reshard_cost(NBYTES, src, dst, mesh, even) - reshard_cost(NBYTES, src, dst, mesh, BARE)
                  - CALL) / PLAIN
        assert got == pytest.approx(priced, rel=1e-9), (s, d)


def _fit(rank, world):
    from autopar.codegen.runtime import reshard_probe

    return fit_moves(reshard_probe, sizes=(2 ** 16, 2 ** 20), repeats=3)


def test_the_fit_times_the_runtime_s_path_and_the_copies_on_every_rank_alike():
    fits = run_threaded(_fit, 2)
    assert fits[0] == fits[1]  # every rank prices plans alike
    fit = fits[0]
    assert fit.call > 0 and fit.copy > 0 and fit.strided > 0
    assert fit_moves() is None  # no process group: nothing to fit
