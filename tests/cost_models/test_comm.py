"""Collective formulas against hand arithmetic; resharding phases; vectorised == scalar."""

import itertools
import random

import numpy as np
import pytest
from autopar.cost_models.comm import collective, reshard_cost, reshard_matrix, reshard_steps

from autopar.core.cluster import Cluster
from autopar.core.layout import Partial, Replicate, Shard
from autopar.core.tables import Mesh

R, P = Replicate(), Partial()
BW, LAT = 100e9, 2e-6
FLAT = Cluster(devices=8, intra_bandwidth=BW, intra_latency=LAT, inter_bandwidth=1e9,
               inter_latency=1e-3)
HIER = Cluster(devices=16, devices_per_node=8, intra_bandwidth=BW, intra_latency=LAT,
               inter_bandwidth=10e9, inter_latency=10e-6)
BIG = Cluster(devices=512, devices_per_node=8)  # 9 mesh axes: the sorted-keys path
# gloo, whose all-gather is slower than its all-reduce (kind_factors as a live fit sets them)
SLOW_GATHER = Cluster(devices=8, devices_per_node=4, intra_bandwidth=BW, intra_latency=LAT,
                      inter_bandwidth=1e9, inter_latency=1e-3, backend="gloo",
                      kind_factors=(("all-gather", 0.5, 3.0), ("all-reduce", 2.0, 1.5)))
# processes sharing cores: every collective also pays a fixed wait once (the cpu preset past its cores)
SLOW_CALL = Cluster(devices=8, devices_per_node=4, intra_bandwidth=BW, intra_latency=LAT,
                    inter_bandwidth=1e9, inter_latency=1e-3, backend="gloo", call_latency=5e-4,
                    kind_factors=(("all-gather", 0.5, 3.0),))
# a measured reshard path: every step pays a call and a copy of its buffer (``reshard_local``)
SLOW_MOVES = Cluster(devices=8, devices_per_node=4, intra_bandwidth=BW, intra_latency=LAT,
                     inter_bandwidth=1e9, inter_latency=1e-3, backend="gloo", move_call=1e-4,
                     copy_time=1e-10, strided_copy_time=2.5e-10, kind_factors=(("all-gather", 0.5, 3.0),))
MB = 2 ** 20


def test_ring_all_reduce_formula():
    c = collective("all-reduce", 4 * MB, (0, 1, 2), FLAT.mesh(), FLAT)
    p = 8
    assert c.p == p and not c.crosses_nodes
    assert c.seconds == pytest.approx(2 * (p - 1) / p * 4 * MB / BW + 2 * (p - 1) * LAT)
    assert "2(p-1)/p*N/bw" in c.formula()


def test_other_collectives():
    m = FLAT.mesh()
    n = 3 * MB
    assert collective("all-gather", n, (0,), m, FLAT).seconds == pytest.approx(0.5 * n / BW + LAT)
    assert collective("reduce-scatter", n, (1, 2), m, FLAT).seconds == pytest.approx(
        0.75 * n / BW + 3 * LAT)
    assert collective("all-to-all", n, (0, 1), m, FLAT).seconds == pytest.approx(0.75 * n / BW + 3 * LAT)
    assert collective("broadcast", n, (0, 1, 2), m, FLAT).seconds == pytest.approx(n / BW + 7 * LAT)
    assert collective("send/recv", n, (2,), m, FLAT).seconds == pytest.approx(n / BW + LAT)
    assert collective("all-reduce", n, (), m, FLAT).seconds == 0.0
    with pytest.raises(ValueError):
        collective("gossip", n, (0,), m, FLAT)


def test_kind_factors_price_their_kind_and_what_the_backend_runs_as_it():
    m = FLAT.mesh()
    n = 3 * MB
    slow = Cluster(devices=8, intra_bandwidth=BW, intra_latency=LAT, inter_bandwidth=1e9,
                   inter_latency=1e-3, kind_factors=(("all-gather", 0.5, 3.0),))
    assert collective("all-gather", n, (0,), m, slow).seconds == pytest.approx(0.5 * n / (0.5 * BW) + 3 * LAT)
    for kind in ("all-reduce", "reduce-scatter", "all-to-all"):  # priced on the links as they are
        assert collective(kind, n, (0, 1), m, slow).seconds == collective(kind, n, (0, 1), m, FLAT).seconds
    # gloo runs an all-to-all as an all-gather of p times the bytes: the all-gather's factors
    gloo = Cluster(devices=8, intra_bandwidth=BW, intra_latency=LAT, backend="gloo",
                   kind_factors=(("all-gather", 0.5, 3.0),))
    assert collective("all-to-all", n, (0,), m, gloo).seconds == pytest.approx(0.5 * 2 * n / (0.5 * BW) + 3 * LAT)
    with pytest.raises(ValueError, match="unknown collectives"):
        Cluster(devices=8, kind_factors=(("allgather", 0.5, 1.0),))
    with pytest.raises(ValueError, match="factors > 0"):
        Cluster(devices=8, kind_factors=(("all-gather", 0.0, 1.0),))
    assert "all-gather at 0.5x the bandwidth, 3x the latency" in slow.describe()  # reports say so
    # a plan file holds them as lists
    assert Cluster(devices=8, kind_factors=[["all-gather", 1, 2]]).kind_factors == (("all-gather", 1.0, 2.0),)


def test_a_call_latency_is_paid_once_per_collective_whatever_its_steps():
    m = SLOW_CALL.mesh()
    n = 3 * MB
    plain = Cluster(devices=8, devices_per_node=4, intra_bandwidth=BW, intra_latency=LAT, inter_bandwidth=1e9,
                    inter_latency=1e-3, backend="gloo", kind_factors=(("all-gather", 0.5, 3.0),))
    for kind, axes in (("all-reduce", (1, 2)), ("all-gather", (2,)), ("reduce-scatter", (1, 2)), ("send/recv", (2,))):
        c = collective(kind, n, axes, m, SLOW_CALL)
        assert c.seconds == pytest.approx(collective(kind, n, axes, m, plain).seconds + 5e-4)
        assert "+ c" in c.formula()
    assert collective("all-reduce", n, (), m, SLOW_CALL).seconds == 0.0  # no group, no call
    # two collectives pay it twice: (P, P) -> (R, S(0)) on the last two axes is a reduce-scatter then an all-reduce
    steps = reshard_steps(n, (R, P, P), (R, R, Shard(0)), m, SLOW_CALL)
    assert len(steps) == 2 and sum(s.seconds for s in steps) == pytest.approx(
        sum(s.seconds for s in reshard_steps(n, (R, P, P), (R, R, Shard(0)), m, plain)) + 2 * 5e-4)
    with pytest.raises(ValueError, match="call_latency"):
        Cluster(devices=8, call_latency=-1e-3)


def test_processes_past_the_cores_pay_a_call_latency_and_one_process_a_core_none(monkeypatch):
    import os

    from autopar.core import cluster as cl

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert Cluster.preset("cpu", devices=2).call_latency == 0.0
    four = Cluster.preset("cpu", devices=4)
    assert four.call_latency == cl.CPU_OVERSUBSCRIBED_CALL > 0 and four.intra_latency == cl.CPU_OVERSUBSCRIBED_LATENCY
    # on 4 processes one all-reduce over all of them (6 ring steps) costs less than the three
    # collectives of (P, P) -> (R, S(0)) then (R, S(0)) -> (R, R) (as measured: 6.3-6.9 ms against
    # 5.8 + 2.0 ms for a [64, 512] fp32 activation)
    m, n = Mesh((2, 2)), 64 * 512 * 4
    one = reshard_cost(n, (P, P), (R, R), m, four)
    three = reshard_cost(n, (P, P), (R, Shard(0)), m, four) + reshard_cost(n, (R, Shard(0)), (R, R), m, four)
    assert one < three


def test_group_crossing_nodes_uses_the_slow_link():
    m = HIER.mesh()  # (2, 2, 2, 2), axis 0 crosses nodes
    inside = collective("all-reduce", MB, (1, 2, 3), m, HIER)
    across = collective("all-reduce", MB, (0, 3), m, HIER)
    assert not inside.crosses_nodes and across.crosses_nodes
    assert across.seconds == pytest.approx(2 * 3 / 4 * MB / 10e9 + 2 * 3 * 10e-6)


def test_reshard_phases_by_hand():
    m = FLAT.mesh()
    n = 8 * MB
    # gather a tensor sharded over two axes: output N = n, p = 4
    (s,) = reshard_steps(n, (Shard(0), Shard(0), R), (R, R, R), m, FLAT)
    assert s.kind == "all-gather" and s.p == 4 and s.nbytes == n
    assert s.seconds == pytest.approx(0.75 * n / BW + 3 * LAT)
    # partial sums wanted replicated: all-reduce of the (unsharded) tensor
    (s,) = reshard_steps(n, (P, R, R), (R, R, R), m, FLAT)
    assert (s.kind, s.p, s.nbytes) == ("all-reduce", 2, n)
    # partial sums wanted sharded: reduce-scatter, cheaper than the all-reduce
    (s,) = reshard_steps(n, (P, P, R), (Shard(0), Shard(1), R), m, FLAT)
    assert (s.kind, s.p, s.nbytes) == ("reduce-scatter", 4, n)
    # slicing is free; a shard moving to another tensor axis is an all-to-all on the local part
    assert reshard_steps(n, (R, R, R), (Shard(0), R, Shard(1)), m, FLAT) == []
    (s,) = reshard_steps(n, (Shard(0), R, R), (Shard(1), R, R), m, FLAT)
    assert (s.kind, s.nbytes) == ("all-to-all", n / 2)
    # a slice first shrinks what is then gathered
    (s,) = reshard_steps(n, (Shard(0), R, R), (R, Shard(1), R), m, FLAT)
    assert (s.kind, s.nbytes) == ("all-gather", n / 2)
    assert reshard_cost(n, (Shard(0), R, R), (Shard(0), R, R), m, FLAT) == 0.0


def _random_layout(rng, axes):
    return tuple(rng.choice([R, P, Shard(0), Shard(1), Shard(1, 3)]) for _ in range(axes))


@pytest.mark.parametrize("cluster", [FLAT, HIER, BIG, SLOW_GATHER, SLOW_CALL, SLOW_MOVES])
def test_vectorised_matrix_equals_scalar_steps(cluster):
    rng = random.Random(0)
    m = cluster.mesh()
    src = [_random_layout(rng, len(m.shape)) for _ in range(25)]
    dst = [_random_layout(rng, len(m.shape)) for _ in range(20)]
    mat = reshard_matrix(5 * MB, src, dst, m, cluster)
    assert mat.shape == (25, 20)
    for (i, a), (j, b) in itertools.product(enumerate(src), enumerate(dst)):
        assert mat[i, j] == pytest.approx(reshard_cost(5 * MB, a, b, m, cluster), rel=1e-12, abs=1e-18)


def test_reshard_rejects_wrong_arity():
    with pytest.raises(ValueError):
        reshard_steps(MB, (R,), (R, R), FLAT.mesh(), FLAT)


def test_empty_matrix():
    assert reshard_matrix(MB, [], [(R, R, R)], FLAT.mesh(), FLAT).shape == (0, 1)
    assert np.all(reshard_matrix(MB, [(R, R, R)], [(R, R, R)], FLAT.mesh(), FLAT) == 0)


def test_nested_shard_order_is_priced_as_dtensor_runs_it():
    """A tensor axis cut by two mesh axes: DTensor 2.13's greedy redistribute replicates the
    misaligned (minor) mesh axis first; checked against CommDebugMode on a (2, 2) gloo mesh by
    tests/codegen/test_codegen_collectives.py."""
    from autopar.cost_models.comm import misaligned

    c = Cluster.preset("cpu", devices=4)
    m, n = c.mesh(), 8 * MB

    def steps(a, b):
        return [(s.kind, s.axes, s.nbytes) for s in reshard_steps(n, a, b, m, c)]

    # device (0, 1) holds rows 2/4..3/4 and needs 1/4..2/4: gather over axis 1, then slice twice
    assert steps((R, Shard(0)), (Shard(0), Shard(0))) == [("all-gather", (1,), n)]
    # its gradient: gather the minor shard, then the major one (one collective over both)
    assert steps((Shard(0), Shard(0)), (R, Shard(0))) == [("all-gather", (0, 1), n)]
    # partial on the minor axis of a to-be-nested shard: all-reduce first, no reduce-scatter
    assert steps((Shard(0), P), (Shard(1), Shard(0))) == [("all-reduce", (1,), n / 2),
                                                          ("all-to-all", (0,), n / 2)]
    assert steps((Shard(1), P), (R, Shard(1))) == [("all-reduce", (1,), n / 2),
                                                   ("all-gather", (0,), n)]
    # aligned nested shards keep the per-axis phases
    assert not misaligned((2, 2), (2, 0)) and not misaligned((0, 0), (2, 2))
    assert steps((P, P), (Shard(0), Shard(0))) == [("reduce-scatter", (0, 1), n)]
    for a, b in [((R, Shard(0)), (Shard(0), Shard(0))), ((Shard(0), P), (Shard(1), Shard(0)))]:
        assert reshard_matrix(n, [a], [b], m, c)[0, 0] == pytest.approx(
            reshard_cost(n, a, b, m, c), rel=1e-12)


def _layout(codes):
    return tuple(R if c == 0 else P if c == 1 else Shard(int(c) - 2) for c in codes)


@pytest.mark.parametrize("preset, shape, level", [("8x8xH100", (2,) * 6, (1, 1, 1, 0, 0, 0)),
                                                  ("2x8xH100", (2,) * 4, (1, 0, 0, 0)),
                                                  ("2x8xH100", (3, 2, 2, 5, 2), (1, 1, 0, 0, 0)),
                                                  ("2x8xH100", (2, 3), (1, 0)),
                                                  ("8xA100", (2, 2, 2), (0, 0, 0)),
                                                  ("8xA100", (4,), (0,)),
                                                  ("slow-gather", (2, 2, 2), (1, 0, 0)),
                                                  ("slow-call", (2, 2, 2), (1, 0, 0)),
                                                  ("slow-moves", (2, 2, 2), (1, 0, 0)),
                                                  ("cpu@4", (2, 2), (0, 0))])
def test_bulk_table_prices_every_pair_as_the_scalar_path(preset, shape, level):
    """reshard_table splits the mesh into two halves and prices each distinct half-walk once;
    every pair must still get exactly its own price: misaligned pairs bit for bit DTensor's walk
    (``_dtensor_steps``), the others the per-axis phases (odd axis counts, unequal axis sizes,
    repeated rows included)."""
    from autopar.cost_models import comm

    cluster = {"slow-gather": SLOW_GATHER, "slow-call": SLOW_CALL, "slow-moves": SLOW_MOVES}.get(preset) or \
        (Cluster.preset("cpu", devices=4) if preset == "cpu@4" else Cluster.preset(preset))
    mesh = Mesh(shape, level)
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, 6, size=(120, len(shape))), rng.integers(0, 6, size=(90, len(shape)))
    src[7], dst[11] = src[3], dst[5]
    bulk = comm.reshard_matrix_codes(3e6, src, dst, mesh, cluster)
    checked = 0
    for i, a in enumerate(map(tuple, src.tolist())):
        for j, b in enumerate(map(tuple, dst.tolist())):
            expected = reshard_cost(3e6, _layout(a), _layout(b), mesh, cluster)
            if comm.misaligned(a, b):
                assert bulk[i, j] == expected, (a, b)
                checked += 1
            else:
                assert bulk[i, j] == pytest.approx(expected, rel=1e-12, abs=1e-18), (a, b)
    assert checked > 100 * (len(shape) - 1) or len(shape) == 1


def test_reshard_structures_are_shared_and_repriced_exactly():
    """A cached structure prices other bytes exactly as a fresh one; the cache stays in its bound."""
    from autopar.cost_models.reshard_table import StructureCache, reshard_table

    cluster = Cluster.preset("8x8xH100")
    mesh = cluster.mesh()
    rng = np.random.default_rng(2)
    src, dst = rng.integers(0, 5, size=(200, 6)), rng.integers(0, 5, size=(150, 6))
    cache = StructureCache()
    first = reshard_table(1e6, src, dst, mesh, cluster, cache)
    again = reshard_table(3e7, src, dst, mesh, cluster, cache)
    assert (cache.hits, cache.misses) == (1, 1)
    assert np.array_equal(first, reshard_table(1e6, src, dst, mesh, cluster))
    assert np.array_equal(again, reshard_table(3e7, src, dst, mesh, cluster))
    assert not np.allclose(first, again)
    reshard_table(1e6, dst, src, mesh, cluster, cache)  # other layouts: another structure
    assert cache.misses == 2
    tiny = StructureCache(max_bytes=1)
    for _ in range(2):
        reshard_table(1e6, src, dst, mesh, cluster, tiny)
    assert tiny.hits == 0 and tiny.misses == 2  # too big to keep: recomputed, never stale


@pytest.mark.parametrize("dense", [True, False])
def test_both_ways_of_finding_the_ids_that_occur_agree(monkeypatch, dense):
    """Marking the whole id space and sorting the ids give the same table (each way forced)."""
    from autopar.cost_models import reshard_table

    cluster = Cluster.preset("2x8xH100")
    mesh = cluster.mesh()
    rng = np.random.default_rng(3)
    src, dst = rng.integers(0, 5, size=(80, 4)), rng.integers(0, 5, size=(70, 4))
    reference = reshard_table.reshard_table(2e6, src, dst, mesh, cluster)
    monkeypatch.setattr(reshard_table, "_DENSE_LIMIT", 1 << 40 if dense else 0)
    monkeypatch.setattr(reshard_table, "_DENSE_PER_PAIR", 1 << 20 if dense else 0)
    assert np.array_equal(reshard_table.reshard_table(2e6, src, dst, mesh, cluster), reference)
    for i, j in [(0, 0), (5, 7), (79, 69)]:
        a, b = _layout(src[i]), _layout(dst[j])
        assert reference[i, j] == pytest.approx(reshard_cost(2e6, a, b, mesh, cluster), rel=1e-12)


def test_sequence_parallelism_moves_what_tensor_parallelism_all_reduces():
    """Megatron's sequence parallelism swaps the all-reduce of a row-parallel linear's partial
    output (P -> R) for a reduce-scatter along the sequence (P -> S(1)) and, before the next
    column-parallel linear, an all-gather (S(1) -> R): the same bytes and latencies in two calls.
    The ring formulas by hand, over the 8 devices of one node."""
    mesh, nbytes, p = FLAT.mesh(), 64 * MB, 8
    axes = (0, 1, 2)
    tp = reshard_steps(nbytes, (P, P, P), (R, R, R), mesh, FLAT)
    scatter = reshard_steps(nbytes, (P, P, P), (Shard(1),) * 3, mesh, FLAT)
    gather = reshard_steps(nbytes, (Shard(1),) * 3, (R, R, R), mesh, FLAT)
    assert [c.kind for c in tp] == ["all-reduce"] and tp[0].axes == axes
    assert [c.kind for c in scatter] == ["reduce-scatter"] and [c.kind for c in gather] == ["all-gather"]
    one_way = (p - 1) / p * nbytes / BW + (p - 1) * LAT
    assert scatter[0].seconds == pytest.approx(one_way) and gather[0].seconds == pytest.approx(one_way)
    assert tp[0].seconds == pytest.approx(2 * one_way)
