"""Pricing published trainings and hand recipes in the hierarchical search: what a pipeline cut
costs, what a data-parallel ring spanning nodes costs, the devices' compute fractions derived from
their papers' one-device baselines, the published trainings against their papers' figures, and a
torchtitan-style recipe pinned beside autopar's plan. Every expected figure is counted here from
the shapes, the links and the papers, not read back from the code under test."""

from __future__ import annotations


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
    return flops / (pr.cost * cluster.devices * s.peak) / rec.utilisation


# The published trainings whose reported utilisation this cost model reaches within 15%. Not here,
# by what is measured (benchmarks/scale.md): mt_nlg_530b (1.46x: Megatron-LM ran the same shape on
# the same machines at 52%, Narayanan et al. 2021 Table 1, against MT-NLG's 36.2%; the bubble of
# its fewer microbatches, priced, explains 52% -> 48%: the rest is the code, see the record).
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


def test_megatron_lms_own_run_of_the_530b_shape_is_priced_within_15_percent():
    """Narayanan et al. 2021, Table 1: the MT-NLG shape (105 layers, hidden 20480, 128 heads) on
    2520 A100 of Selene, tensor 8 x pipeline 35 x data 9, batch 2520, microbatch 1, recomputation,
    fp16: 163 TFLOP/s per GPU, 52% of peak counting the recomputation. The same plan that MT-NLG
    reports at 36.2% with a different code on 3360 GPUs."""
    from autopar.zoo.published import mt_nlg_530b

    cluster = Cluster.preset("315x8xdgxa100")
    s = _search(mt_nlg_530b(batch=2520), cluster, "fp16")
    best, _, _, _ = s.best(Pin(tensor=8, pipeline=35, data=9, zero=0, recompute=True, microbatch=1), (0,), (True,))
    hfu = (s.totals.train_flops + s.totals.forward_flops) / (best.cost * cluster.devices * s.peak)
    assert 0.85 <= hfu / 0.52 <= 1.15


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
