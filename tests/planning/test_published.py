"""Pricing published trainings and hand recipes in the hierarchical search: what a pipeline cut
costs, what a data-parallel ring spanning nodes costs, the devices' compute fractions derived from
their papers' one-device baselines, the published trainings against their papers' figures, and a
torchtitan-style recipe pinned beside autopar's plan. Every expected figure is counted here from
the shapes, the links and the papers, not read back from the code under test."""

from __future__ import annotations

import functools

import pytest

import autopar
from autopar.core.cluster import Cluster
from autopar.core.margin import usable_memory
from autopar.core.strategy import Degrees
from autopar.planning import hierarchical as H
from autopar.planning.degrees import Pin
from autopar.planning.step_price import Candidate, dp_sync
from autopar.search.dp import dp

B, S, W = 8, 32, 64


def _search(model_inputs, cluster, precision="bf16"):
    model, inputs = model_inputs
    g = autopar.trace(model, inputs)
    return H.Search(g, cluster, precision, "adam", "train", usable_memory(cluster.memory_capacity), lambda t, g=None: dp(t))


def test_a_pipeline_cut_costs_the_slice_sent_and_the_all_gather_that_rebuilds_it():
    """Two stages across nodes, tensor 2 in a node: per microbatch a stage sends its half of the
    residual stream (b x s x w bf16) forward and its gradient back, and each receiver all-gathers
    the two halves over NVLink (Megatron's scatter/gather); counted with the ring formulas."""
    cluster = Cluster.preset("2x4xA100")
    s = _search(autopar.zoo.get("gpt", layers=4, width=W, heads=4, seq=S, batch=B, vocab=256, device="meta"), cluster)
    m = 4
    c = Candidate(Degrees((2, 1), (1, 2), (2, 1)), m)  # tensor 2 x data 2 in a node, pipeline 2 across
    pr = s.price(c)
    full = (B // (2 * m)) * S * W * 2  # one microbatch's residual stream, bf16
    send = cluster.inter_latency + cluster.call_latency + (full / 2) / cluster.inter_bandwidth
    gather = (1 / 2) * full / cluster.intra_bandwidth + cluster.intra_latency + cluster.call_latency
    assert pr.terms["pipeline send/recv"] == pytest.approx(m * 2 * (send + gather), rel=1e-9)


def test_a_data_parallel_ring_across_nodes_gets_the_links_of_its_ranks_in_a_node():
    """Tensor 2 x data 2 in a node of 4, data 4 across nodes: the two rings (one per tensor rank)
    each cross a node's boundary once and share its 4 devices' links: 2 devices' worth each."""
    cluster = Cluster.preset("4x4xA100")
    grads = 1e9
    deg = Degrees((2, 1), (1, 1), (2, 4))
    bw = min(2 * cluster.inter_bandwidth, cluster.intra_bandwidth)
    ranks = 8
    hand = 2 * (ranks - 1) / ranks * grads / bw + 2 * (ranks - 1) * cluster.inter_latency + cluster.call_latency
    assert dp_sync(0, grads, grads, 1, cluster, deg, False) == pytest.approx(hand, rel=1e-9)
    # one data rank per node: no sharing, the device's own link
    one = Degrees((4, 1), (1, 1), (1, 4))
    hand1 = 2 * 3 / 4 * grads / cluster.inter_bandwidth + 2 * 3 * cluster.inter_latency + cluster.call_latency
    assert dp_sync(0, grads, grads, 1, cluster, one, False) == pytest.approx(hand1, rel=1e-9)


def test_the_dgx2h_compute_fraction_reproduces_megatron_lms_one_gpu_baseline():
    """Shoeybi et al. 2019, section 5.1: the 1.2B model (hidden 1536, 40 layers, 16 heads,
    sequence 1024) on one V100 of a DGX-2H sustains 39 TFLOP/s, 30% of its 130 TFLOP/s peak; the
    preset's matmul fraction must give that back through the whole model (memory-bound kernels and
    the optimizer priced apart). Batch 8 (the 8.3B run's per-replica batch), fp16, recomputation."""
    from autopar.zoo.published import megatron_8b

    cluster = Cluster.preset("dgx2h", devices=1)
    s = _search(megatron_8b(batch=8, width=1536, heads=16, layers=40), cluster, "fp16")
    best, _, _, _ = s.best(Pin(tensor=1, pipeline=1, data=1, zero=0, recompute=True, microbatch=8), (0,), (True,))
    flops = s.totals.train_flops + s.totals.forward_flops  # hardware FLOPs, as the 8.3B figure is compared
    assert flops / (best.cost * 130e12) == pytest.approx(0.30, abs=0.006)


def _published_ratio(name: str) -> float:
    return _published(name)[0]


@functools.lru_cache(maxsize=None)
def _published(name: str):
    """(reported over predicted utilisation, the paper's plan priced, the search) of a published training."""
    rec = autopar.zoo.published_run(name)
    cluster = Cluster.preset(rec.cluster)
    s = _search(autopar.zoo.get(name), cluster, rec.precision)
    pin = Pin(tensor=rec.tensor, pipeline=rec.pipeline, data=rec.data, zero=rec.zero, recompute=rec.recompute,
              microbatch=rec.microbatch_size, zero_inner=rec.zero_inner or None,
              context=rec.context if rec.context > 1 else None, schedule=rec.schedule,
              ring=False if rec.context > 1 else None)  # Llama 3 gathered K/V, as the CLI's --published pins
    recs = (False, True, "pointwise")  # not stated: searched (--published weighs every k-th too: the same picks)
    best, least, _, _ = s.best(pin, (rec.zero,), recs if rec.recompute is None else (rec.recompute,),
                               schedules=H.pin_schedules(pin))
    pr = best or least
    flops = s.totals.train_flops + (s.totals.forward_flops if pr.candidate.recompute and rec.measure == "hardware"
                                    else 0.0)
    return flops / (pr.cost * cluster.devices * s.peak) / rec.utilisation, pr, s


# The published trainings whose reported utilisation this cost model reaches within 15%. Not here,
# by what is measured (benchmarks/scale.md): mt_nlg_530b (1.39x: Megatron-LM ran the same shape on
# the same machines at 52%, Narayanan et al. 2021 Table 1, priced within 15% in TABLE_1 below,
# against MT-NLG's 36.2%; the bubble of its fewer, non-interleaved microbatches, priced, explains
# 52% -> 44.6%: the rest, 1.23x per microbatch, is not in what DeepSpeed's and Megatron-DeepSpeed's
# public code of the time does per microbatch, timed mechanism by mechanism in the record).
# llama3_405b (0.89x) is priced with pointwise recomputation (core/selective.py): without any it
# would be 0.96x, but the zoo's eager Llama keeps what torch's autograd keeps for it (counted with
# saved-tensor hooks in tests/cost_models/test_saved_tensors.py), 42.3 bytes per token and unit of
# width per layer in bf16 -- the SwiGLU's four ffn-sized tensors 26, the two eager RMSNorms 12, the
# attention 4.3 -- 84.6 GiB in flight on the first of 16 stages against an H100's 66.6 GiB usable;
# keeping only the matmuls' and attention's outputs (about 23 bytes) fits, for the norms', SwiGLU's
# and rotary products' forward again (every 2nd block recomputed instead: 0.79x).
@pytest.mark.parametrize("name", ["megatron_8b", "megatron_1t", "palm_540b", "llama3_405b", "llama3_405b_long"])
def test_a_published_training_is_priced_within_15_percent_of_its_papers_figure(name):
    assert 0.85 <= _published_ratio(name) <= 1.15


def test_palms_paper_plan_fits_with_its_parameters_gathered_per_block():
    """PaLM 540B ran tensor 12 x data 512 with its parameters sharded over the data axis (ZeRO-3
    inside each pod): held whole, 540e9 x 2 bytes / 12 = 90 GB a chip, far over a TPU v4's 32 GiB.
    Gathered one block at a time (as ``fully_shard`` per block does) the plan fits: its parameters
    are the 1/(12 x 256) shards, and what it holds whole is two blocks' and the embedding's. The
    zoo's model also keeps a causal mask buffer per block (2048 x 2048 bool, 495 MB over 118
    blocks): not a parameter, never sliced, held whole on every chip as codegen holds it."""
    _, pr, s = _published("palm_540b")
    model, _ = autopar.zoo.get("palm_540b")
    shards = 2 * sum(p.numel() for p in model.parameters()) / (12 * 256)  # bf16
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert pr.candidate.zero == 3 and pr.candidate.zero_inner
    assert 0.95 * (shards + buffers) <= pr.memory_terms["parameters"] <= 1.05 * (shards + buffers)
    assert pr.fits and pr.memory <= s.capacity < 2 * 540e9 / 12


# Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
# Megatron-LM", SC21), Table 1: GPT models of sequence 2048 and vocabulary 51,200 on DGX A100
# nodes of Selene, fp16, activation recomputation, the achieved TFLOP/s per GPU counting the
# recomputation (their formula 96 B s l h^2 (1 + s / 6h + V / 16lh)). The microbatch sizes and the
# interleaved schedule's layers per virtual stage are Megatron-LM's own script for that table
# (NVIDIA/Megatron-LM, examples/sc21/run_table_1.sh), which the paper's text does not list.
# (name, heads, hidden, layers, tensor, pipeline, GPUs, batch, microbatch, layers per virtual
# stage or 0: plain 1F1B, TFLOP/s per GPU)
TABLE_1 = [("1.7B", 24, 2304, 24, 1, 1, 32, 512, 16, 0, 137), ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 16, 0, 138),
           ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 16, 0, 142), ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 8, 0, 135),
           ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 4, 0, 138), ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 2, 5, 140),
           ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 2, 5, 148),
           ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 1, 3, 155),
           ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 1, 1, 163),
           ("1008B", 160, 25600, 128, 8, 64, 3072, 3072, 1, 0, 163)]


@pytest.mark.parametrize("row", TABLE_1, ids=[r[0] for r in TABLE_1])
def test_megatron_lms_table_1_is_priced_within_15_percent_of_its_step_time(row):
    """Each row's plan pinned as it ran (tensor in a node, pipeline across nodes, data the rest;
    ``GPUs / (tensor x pipeline)`` replicas of ``batch / (replicas x microbatch)`` microbatches;
    interleaved 1F1B with ``layers / pipeline / (layers per virtual stage)`` stages per rank where
    the script sets one): the step time its FLOP formula and TFLOP/s give, over the predicted one.
    The 529.6B row is MT-NLG's shape and degrees run by Megatron-LM (tensor 8 x pipeline 35)."""
    from autopar.core.strategy import Degrees
    from autopar.zoo.gpt import gpt

    name, heads, h, layers, t, p, gpus, batch, mbs, per_virtual, tflops = row
    seq, vocab = 2048, 51200
    cluster = Cluster.preset(f"{gpus // 8}x8xdgxa100")
    s = _search(gpt(batch=batch, seq=seq, width=h, heads=heads, layers=layers, vocab=vocab, attention="manual",
                    device="meta", tie=True), cluster, "fp16")
    d = gpus // (t * p)
    v = layers // p // per_virtual if per_virtual else 1
    c = Candidate(Degrees((t, 1), (1, p), (8 // t, d // (8 // t))), batch // (d * mbs), zero=0, recompute=True,
                  schedule="interleaved-1f1b" if v > 1 else "1f1b", stages_per_rank=v if v > 1 else 0)
    pr = s.price(c)
    flops = 96 * batch * seq * layers * h * h * (1 + seq / (6 * h) + vocab / (16 * layers * h))
    measured = flops / (gpus * tflops * 1e12)
    assert pr.fits
    assert 0.85 <= measured / pr.cost <= 1.15


def test_each_microbatch_after_the_first_adds_its_gradients_into_the_held_ones():
    """Gradient accumulation over m microbatches: autograd adds each new gradient into ``.grad``
    in place (read both, write one: 3 passes over the gradient bytes), m - 1 times a step; here
    data 8 in a node, 4 microbatches, bf16 gradients of every parameter (torch's count, the tied
    embedding once), whole without ZeRO and an eighth with ZeRO-2, at the memory's bandwidth x
    0.8 (the analytic model's memory-bound efficiency)."""
    from autopar.core.strategy import Degrees

    cluster = Cluster.preset("8xA100")
    model, inputs = autopar.zoo.get("gpt", layers=4, width=W, heads=4, seq=S, batch=4 * B, vocab=256,
                                    device="meta", tie=True)
    numel = sum(p.numel() for p in model.parameters())
    s = _search((model, inputs), cluster)
    for zero, shard in ((0, 1), (2, 8)):
        pr = s.price(Candidate(Degrees((1,), (1,), (8,)), 4, zero=zero))
        hand = (4 - 1) * 3 * 2 * numel / shard / (cluster.memory_bandwidth * 0.8)
        assert pr.terms["gradient accumulation"] == pytest.approx(hand, rel=1e-9)
        assert s.price(Candidate(Degrees((1,), (1,), (8,)), 1, zero=zero)).terms["gradient accumulation"] == 0.0


def test_a_torchtitan_style_recipe_is_priced_beside_autopars_plan_which_is_no_slower_and_fits():
    """FSDP (ZeRO-3) with full activation checkpointing, the torchtitan Llama 3 8B recipe, on 16
    H100 for a small Llama: pinned and priced; autopar's plan of the same space is no slower."""
    model, inputs = autopar.zoo.get("llama", batch=32, seq=128, width=256, heads=8, kv_heads=2, ffn=512,
                                    layers=4, vocab=1024, device="meta")
    cluster = Cluster.preset("2x8xH100")
    plan = autopar.plan(model, inputs, cluster, hierarchical=True, precision="bf16",
                        pin="tensor=1,pipeline=1,zero=3,recompute=1")
    recipe = plan.baselines["published"]
    d = recipe.strategy.degrees
    assert (d.t, d.p, d.d) == (1, 1, 16) and recipe.strategy.options.zero == 3 and recipe.strategy.recompute
    capacity = usable_memory(cluster.memory_capacity)
    assert plan.memory_per_device <= capacity
    assert plan.cost <= recipe.cost * (1 + 1e-12)


def test_deepspeeds_schedule_replayed_with_blocking_sends_takes_the_1f1b_slots():
    """``benchmarks/deepspeed_pipe.py`` replays DeepSpeed's ``TrainSchedule`` (what the MT-NLG
    record's send/recv figures rest on). Equal stages and instant transfers: ``(m + p - 1)(F + B)``,
    the 1F1B step counted by hand, for even and odd stage counts; blocking transfers of ``c`` cost
    a stage at most its four transfers a microbatch (recv and send each way), ``4c`` per slot; a
    slower last stage sets the pace: at least its ``m`` microbatches after the others' fill."""
    from benchmarks.deepspeed_pipe import program, simulate

    F, B = 1.0, 3.0
    for p, m in ((2, 1), (4, 8), (5, 7), (35, 160)):
        assert simulate([F] * p, [B] * p, 0.0, m) == pytest.approx((m + p - 1) * (F + B))
        sends = sum(op[0] == "send" for op in program(1, p, m))
        assert sends == (2 * m if 0 < 1 < p - 1 else m)  # one activation and one gradient a microbatch
    p, m, c = 6, 12, 0.05
    assert (m + p - 1) * (F + B) < simulate([F] * p, [B] * p, c, m) <= (m + p - 1) * (F + B + 4 * c)
    slow = simulate([F] * (p - 1) + [F + 0.5], [B] * (p - 1) + [B + 1.0], 0.0, m)
    assert slow >= (p - 1) * F + m * (F + B + 1.5)
