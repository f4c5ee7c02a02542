"""ZeRO, mixed precision and recomputation in the cost and memory models, against hand arithmetic.

Every expected number below is written from first principles (bytes per parameter from the ZeRO
paper's accounting, ring collectives from Thakur et al.), not read back from the code under test.
The model: x (8, 1024) -> Linear(1024, 1024, no bias) -> ReLU -> Linear(1024, 1024, no bias),
on 4 devices of one flat fabric with round figures, data parallel (batch over both mesh axes).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import autopar
from autopar.core.blocks import apply_training, repeated_blocks
from autopar.core.cluster import Cluster
from autopar.core.strategy import TrainingOptions
from autopar.core.tables import Config
from autopar.cost_models.analytic import AnalyticModel
from autopar.cost_models.memory import node_memory, node_memory_vector, plan_memory

N = 1024 * 1024  # elements of one weight
BW, LAT = 100e9, 1e-6
CLUSTER = Cluster(devices=4, peak_flops={"float32": 10e12, "bfloat16": 100e12}, memory_bandwidth=1e12,
                  intra_bandwidth=BW, intra_latency=LAT, inter_bandwidth=BW, inter_latency=LAT)
MODEL = AnalyticModel(compute_efficiency=0.5, memory_efficiency=1.0)
DP = Config(splits=(4, 1, 1), mesh_axes=((0, 1), (), ()))  # linear dims (b, n, k): batch over both axes


@pytest.fixture(scope="module")
def graph():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(1024, 1024, bias=False), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 1024, bias=False))
    return autopar.trace(m, (torch.randn(8, 1024),))


def first_linear(g):
    return g.nodes[0]


@pytest.mark.parametrize("options, params, grads, optimizer", [
    # fp32 Adam: 4 B weights, 4 B gradients, 2 x 4 B moments
    (TrainingOptions(), 4 * N, 4 * N, 8 * N),
    # mixed precision: 2 B bf16 weights, 2 B gradients, 2 x 4 B moments + 4 B fp32 master = 16 B
    (TrainingOptions(precision="bf16"), 2 * N, 2 * N, 12 * N),
    # ZeRO-1 over the 4 data-parallel devices: optimizer state and master weights / 4
    (TrainingOptions(zero=1, precision="bf16"), 2 * N, 2 * N, 3 * N),
    # ZeRO-2: gradients / 4 too
    (TrainingOptions(zero=2, precision="bf16"), 2 * N, 0.5 * N, 3 * N),
    # ZeRO-3: everything / 4: 16 N / 4
    (TrainingOptions(zero=3, precision="bf16"), 0.5 * N, 0.5 * N, 3 * N),
    (TrainingOptions(zero=3), 1 * N, 1 * N, 2 * N),
])
def test_parameter_state_bytes(graph, options, params, grads, optimizer):
    g = apply_training(graph, options)
    node = first_linear(g)
    m = node_memory(node, DP, CLUSTER.mesh(), optimizer="adam")
    assert (m.params, m.grads, m.optimizer) == (params, grads, optimizer)
    # the vector form (what the search's tables hold) agrees, activations included
    vec = node_memory_vector(node, [DP], CLUSTER.mesh(), optimizer="adam")
    assert vec[0] == pytest.approx(m.total)
    # the saved input: x is (8, 1024), 2 rows per device, in the compute dtype
    assert m.activations == 2 * 1024 * (2 if options.mixed else 4)


def test_zero_sync_time_by_hand(graph):
    """Gradient bytes per device G = P = 2 N (bf16, unsplit weight); 4 devices in one ring. The
    runtime sums gradients in DDP's 25 MiB buckets, so a node pays its bytes' share of a bucket's
    latency terms: a = LAT x G / 25 MiB."""
    G = 2 * N
    a = LAT * G / (25 * 2**20)
    allreduce = 2 * 3 / 4 * G / BW + 2 * 3 * a
    rs_ag = (3 / 4 * G / BW + 3 * a) + (3 / 4 * G / BW + 3 * a)
    zero3 = 2 * (3 / 4 * G / BW + 3 * a) + (3 / 4 * G / BW + 3 * a)
    for zero, expected in ((0, allreduce), (1, rs_ag), (2, rs_ag), (3, zero3)):
        node = first_linear(apply_training(graph, TrainingOptions(zero=zero, precision="bf16")))
        nc = MODEL.node_breakdown(node, DP, CLUSTER)
        sync = [t for t in nc.terms if t.kind == "sync"]
        assert len(sync) == 1 and sync[0].seconds == pytest.approx(expected, rel=1e-12)
        assert MODEL.node_cost(node, [DP], CLUSTER)[0] == pytest.approx(nc.seconds, rel=1e-12)
    assert allreduce == pytest.approx(rs_ag)  # a ring all-reduce is a reduce-scatter + all-gather


def test_bf16_compute_runs_at_the_bf16_peak(graph):
    """Forward of the first linear: 2 b n k FLOPs over 4 devices at peak x efficiency (memory so
    fast that the roofline's byte term never binds)."""
    flops = 2 * 8 * 1024 * 1024
    fast = dataclasses.replace(CLUSTER, memory_bandwidth=1e18)
    for options, peak in ((TrainingOptions(), 10e12), (TrainingOptions(precision="bf16"), 100e12)):
        node = first_linear(apply_training(graph, options))
        nc = MODEL.node_breakdown(node, DP, fast)
        fwd = next(t for t in nc.terms if t.kind == "compute")
        assert fwd.seconds == pytest.approx(flops / 4 / (peak * 0.5), rel=1e-12)


def test_recompute_runs_the_forward_again_and_saves_only_block_inputs(graph):
    """Every Sequential entry is a block here. Recomputed, a node costs forward + backward (2x)
    + forward again, and saves only the inputs coming from outside its block."""
    assert [b.path for b in repeated_blocks(graph)] == ["0", "1", "2"]
    plain = apply_training(graph, TrainingOptions(precision="bf16"))
    rec = apply_training(graph, TrainingOptions(precision="bf16", recompute=True))
    node, node_rc = plain.nodes[0], rec.nodes[0]
    fwd = next(t.seconds for t in MODEL.node_breakdown(node, DP, CLUSTER).terms if t.kind == "compute")
    extra = MODEL.node_cost(node_rc, [DP], CLUSTER)[0] - MODEL.node_cost(node, [DP], CLUSTER)[0]
    assert extra == pytest.approx(fwd, rel=1e-9)
    # the linear's input x comes from outside its block: kept; nothing else of the block is
    assert node_memory(node_rc, DP, CLUSTER.mesh()).activations == 2 * 1024 * 2
    relu = rec.nodes[1]  # its own block: it keeps its input (the first linear's output)
    assert node_memory(relu, Config((4, 1), ((0, 1), ())), CLUSTER.mesh()).activations == 2 * 1024 * 2


def test_recompute_of_a_gpt_block_keeps_only_the_block_input():
    """A GPT block recomputed keeps its input x (b s w elements, bf16): the two reads of it (the
    first norm and the residual add) keep it once; everything inside the block keeps nothing."""
    b, s, w, layers = 2, 16, 32, 3
    model, inputs = autopar.zoo.get("gpt", layers=layers, width=w, heads=4, seq=s, batch=b, vocab=64,
                                    device="meta")
    g = autopar.trace(model, inputs)
    one = Cluster(devices=1)
    rep = {n.name: Config((1,) * len(n.dims), ((),) * len(n.dims)) for n in g.nodes}
    rec = apply_training(g, TrainingOptions(precision="bf16", recompute=True))
    plain = apply_training(g, TrainingOptions(precision="bf16"))
    inside = {i for blk in repeated_blocks(g) for i in blk.nodes}
    _, per_rec = plan_memory(rec, rep, one.mesh())
    _, per_plain = plan_memory(plain, rep, one.mesh())
    acts_rec = sum(per_rec[rec.nodes[i].name].activations for i in inside)
    acts_plain = sum(per_plain[plain.nodes[i].name].activations for i in inside)
    assert acts_rec == layers * b * s * w * 2
    assert acts_plain > 5 * acts_rec  # what recomputation gives back
    outside = [n.name for i, n in enumerate(g.nodes) if i not in inside]
    assert all(per_rec[k].activations == per_plain[k].activations for k in outside)


def test_recompute_repeats_the_forward_reshard_into_the_block(graph):
    """An edge into a recomputed consumer pays its forward reshard twice. Producer split by
    rows of the output features (n over both axes), consumer replicated: the forward all-gathers
    the activation (8 x 1024 bf16 = 16 KiB, p = 4), the backward slices (free)."""
    col = Config(splits=(1, 4, 1), mesh_axes=((), (0, 1), ()))
    rep = Config(splits=(1, 1), mesh_axes=((), ()))
    nbytes = 8 * 1024 * 2
    gather = 3 / 4 * nbytes / BW + 3 * LAT
    costs = []
    for recompute in (False, True):
        g = apply_training(graph, TrainingOptions(precision="bf16", recompute=recompute))
        costs.append(MODEL.edge_cost(g.nodes[0], 0, g.nodes[1], 0, [col], [rep], CLUSTER)[0, 0])
    assert costs[1] - costs[0] == pytest.approx(gather, rel=1e-9)


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="ZeRO stage"):
        TrainingOptions(zero=4)
    with pytest.raises(ValueError, match="precision"):
        TrainingOptions(precision="fp8")
    assert dataclasses.replace(TrainingOptions(), zero=3).describe().startswith("ZeRO-3")


def test_the_gradient_reduction_pays_its_bucket_copy(graph):
    """With a fitted plain-copy time (``Cluster.copy_time``) every gradient reduction also copies
    the gradient into its bucket (the runtime's flat buffer): G bytes at that rate, once per
    reduction of the step, beside the ring's terms above; the all-gathers of ZeRO copy nothing.
    The tables (``node_cost``) and the breakdown agree."""
    G = 2 * N
    copy = 1e-10  # 10 GB/s
    cluster = dataclasses.replace(CLUSTER, copy_time=copy)
    for zero in (0, 1, 2, 3):
        node = first_linear(apply_training(graph, TrainingOptions(zero=zero, precision="bf16")))
        plain = [t for t in MODEL.node_breakdown(node, DP, CLUSTER).terms if t.kind == "sync"][0].seconds
        nc = MODEL.node_breakdown(node, DP, cluster)
        sync = [t for t in nc.terms if t.kind == "sync"]
        assert sync[0].seconds == pytest.approx(plain + G * copy, rel=1e-12)
        said = [t.formula for t in MODEL.node_breakdown(node, DP, cluster, text=True).terms if t.kind == "sync"]
        assert "copied into their bucket" in said[0]
        assert MODEL.node_cost(node, [DP], cluster)[0] == pytest.approx(nc.seconds, rel=1e-12)
    # a replicated weight reduces nothing and copies nothing
    node = first_linear(graph)
    whole = Config(splits=(1, 1, 1), mesh_axes=((), (), ()))
    assert not [t for t in MODEL.node_breakdown(node, whole, cluster).terms if t.kind == "sync"]
