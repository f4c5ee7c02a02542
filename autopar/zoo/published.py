"""The largest published trainings, as zoo models with their papers' shapes, and what they ran.

Each factory builds the model on ``device="meta"`` by default (shapes only: no weights are
allocated) with the paper's width, depth, heads, vocabulary, sequence length and *global* batch
(the planner splits it into data-parallel shards and microbatches). ``PUBLISHED[name]`` is the
training the paper reports: its cluster (an ``autopar.Cluster`` preset), its degrees, options and
measured utilisation, so ``autopar plan zoo:NAME --published`` can price it beside autopar's plan.

* ``megatron_8b`` -- Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion Parameter Language
  Models Using Model Parallelism", Table 1 and section 5: GPT-2 8.3B, 72 layers, hidden 3072,
  32 heads, sequence 1024, vocabulary 51,200, global batch 512; 8-way model parallel x 64-way data
  parallel on 512 V100 (32 DGX-2H); mixed precision (fp16), activation checkpointing per layer;
  "15.1 PetaFLOPs per second sustained over the entire application", 76% scaling efficiency.
  The paper does not say whether its FLOP count includes the recomputed forward; its follow-up
  (Narayanan et al. 2021) does, so it is compared as hardware FLOPs.
* ``megatron_1t`` -- Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM", Table 1: 1008B, 128 layers, hidden 25600, 160 heads, sequence 2048,
  vocabulary 51,200, batch 3072; tensor 8 x pipeline 64 on 3072 A100 (data 6); microbatch 1,
  activation recomputation, fp16; 163 TFLOP/s per GPU = 52% of peak, counting the recomputation
  (their FLOP formula 96 B s l h^2 (1 + s/6h + V/16lh) has the factor 4 of fwd + bwd + recompute).
* ``mt_nlg_530b`` -- Smith et al. 2022, "Using DeepSpeed and Megatron to Train Megatron-Turing NLG
  530B", sections 2-3: 105 layers, hidden 20480, 128 heads, sequence 2048, global batch 1920;
  tensor 8 x pipeline 35 x data 12 = 3360 A100 (420 DGX A100), ZeRO stage 1 data parallelism,
  microbatch 1, recomputation, bf16; 113 TFLOP/s per GPU at 420 nodes = 36.2% of peak (its
  table), same FLOP formula. Vocabulary: GPT-2's 50,257 padded to 51,200 as in Megatron-LM.
  Its section 2.4 gives batch 1920 on 280, 350 and 420 nodes (data 8, 10, 12) at 60.1, 50.2 and
  44.4 s per iteration: 126, 121, 113 TFLOP/s. Megatron-LM ran the same shape (tensor 8 x
  pipeline 35, microbatch 1, recomputation) on 2520 A100 of the same machine at 163 TFLOP/s,
  batch 2520 (Narayanan et al. 2021, Table 1), interleaving 3 stages of one layer per rank
  (its script for that table, NVIDIA/Megatron-LM examples/sc21/run_table_1.sh). What the papers
  state that differs: 160 microbatches per pipeline in plain 1F1B against 280 interleaved (a
  bubble of 34/160 against 34/(3 x 280) of the microbatches), ZeRO-1 over 12 data-parallel ranks
  against plain data parallelism over 9, bf16 against fp16 (the same A100 peak). Those are priced.
  At Megatron-LM's speed per microbatch, 160 microbatches give 52% x (280 + 34/3) / 280 x
  160 / 194 = 44.6% of peak, not 36.2%: 1.23x slower per microbatch on the same machines,
  shape and layers per rank, which the paper does not break down. The three sizes price at
  45.1, 37.2 and 32.0 s per iteration (165 ms per slot of the m + 34), 1.33x, 1.35x and 1.39x
  faster than measured; 1.198 x the price + 6.0 s per step fits all three within 0.8% (one
  factor leaves a 4.5% trend with the data degree). What the code the run used does that the
  price lacks, read in microsoft/DeepSpeed at e2fdd254e (2021-09-29: the first engine that
  partitions Megatron-DeepSpeed's one-tensor stage outputs; May 2021's indexes a mask beside
  them) and microsoft/Megatron-DeepSpeed at 8a132ced (2021-06, ``GPTModelPipe``), timed with the
  preset's links on the slowest stage (the last: 3 layers and the head):
  - send/recv (deepspeed/runtime/pipe/engine.py ``_exec_send_activations``, ``_exec_recv_grads``
    and the like; p2p.py ``send``/``recv``, blocking): each tensor rank sends its 1/8 slice
    (10.5 MB, 0.47 ms) and a meta tensor, and ``PartitionedTensor.full`` all-gathers it (0.39
    ms, plus 0.17 ms of zero and clone passes); a middle stage also re-gathers its own output
    before the backward; the causal mask is cached, not sent (pretrain_gpt.py ``args.attn_mask``).
    ``TrainSchedule`` replayed with blocking sends and these costs per stage (benchmarks/
    deepspeed_pipe.py): 33.02 s against 33.22 s for (m + p - 1) x the slowest stage with the
    priced scatter/gather: nothing more.
  - recomputation with partitioned activations (activation_checkpointing/checkpointing.py
    ``gather_partitioned_activations``; the flag is not stated): an all-gather of each layer's
    input, 0.44 ms a layer, 1.3 ms per microbatch (0.8%), not priced; only transformer layers
    are checkpointed (pipe/module.py ``_is_checkpointable``).
  - gradient accumulation: ZeRO-1 (zero/stage2.py ``reduce_ready_partitions_and_remove_grads``)
    acts only at the step's last microbatch, so autograd adds into bf16 ``.grad``, 6 bytes an
    element, as priced (7.4 ms per microbatch, 2.02e9 elements). The first public bf16 pipeline path (bf16_optimizer.py ``update_hp_grads``, April
    2022, after the run) adds into fp32 after every microbatch, 18 bytes: +14.9 ms (9%) if the
    run's unpublished bf16 path did the same.
  - Megatron-LM's own fused kernels (``ParallelTransformerLayerPipe`` is its transformer layer;
    the fused softmax takes bf16), priced alike for both runs; the loss in fp32, as Megatron-LM
    computes it (0.3 ms, not priced apart); a host synchronisation per forward (utils/timer.py
    ``ThroughputTimer.start``) and per partition meta (``from_meta``): tens of microseconds.
  - per step: the tied embedding's all-reduce between the first and last stage (262 MB across
    nodes, 12 ms, not priced) and the ZeRO-1 sync after the last microbatch, none of it under
    compute (329 ms against the 173 ms priced as exposed): 0.17 s.
  Together about 2 ms per microbatch and 0.17 s per step, 1.7% of the step (11% with fp32
  accumulation): the public code does not account for the 1.23x, so none of it is added here.
  The micro-batch size is the one figure of the run that the three scales pin down: with the
  same work per replica, (m + p - 1) slots of one stage's microbatch fit 60.1, 50.2 and 44.4 s
  with p - 1 = 34 bubble slots at 2 sequences a microbatch (m = 120, 96, 80: 390, 386, 389 ms a
  slot), while at 1 they need 51-66 bubble slots, or the 6 s a step above. Priced at 2 the three
  read 1.22x, 1.21x and 1.22x (49.3, 41.6, 36.5 s), no longer trending with the data degree;
  still 1.2x slower per sequence than priced, against Megatron-LM's 1.08x on the same shape. The
  preset keeps 1, the size this file has always priced, until a source for the run states it.
* ``palm_540b`` -- Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways", Table 1
  and sections 4 and 5: 118 layers, d_model 18432, 48 heads of 256, d_ff 73728 (SwiGLU),
  multi-query attention, parallel blocks, vocabulary 256k, sequence 2048, batch 2048 sequences
  (the last and longest phase of its batch schedule); 6144 TPU v4 in 2 pods of 3072, 12-way model
  parallelism x 256-way fully sharded data parallelism in each pod, 2-way data parallel across
  pods, no pipeline, rematerialisation, bf16; 46.2% model FLOPs utilisation (57.8% hardware).

* ``llama3_405b`` -- Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3 and section 3.3:
  126 layers, hidden 16384, FFN 53248 (SwiGLU), 128 heads / 8 key-value heads, vocabulary 128,256,
  sequence 8192, 16M-token batches (2048 sequences); 16,384 H100 (80 GB HBM3, one 400 Gb/s link
  per GPU), tensor 8 x pipeline 16 x data 128 (Table 4), BF16, FSDP sharding optimizer states and
  gradients; 16 sequences per data-parallel replica, microbatch 1; "400 TFLOPs/GPU", "41%" BF16
  MFU (Table 4). Interleaved 1F1B (section 3.3.2); recomputation is not stated: the planner
  searches it, and the stages per rank.
* ``llama3_405b_long`` -- the same paper's long-context stage (Table 4): sequence 131,072, 16M-token
  batches (128 sequences), tensor 8 x context 16 x pipeline 16 x data 8 on 16,384 H100; "380
  TFLOPs/GPU", 38% BF16 MFU.

Pipeline schedules, as each ran: Megatron-LM 2021 (``megatron_1t``) its default, non-interleaved
1F1B (the interleaved schedule is an option its Table 1 does not state; zero bubble came in 2024);
MT-NLG's DeepSpeed pipeline engine has 1F1B only; Llama 3 states an interleaved 1F1B whose stages
per rank and microbatches it tuned (section 3.3.2): the planner searches its v.

What the zoo's models differ in, stated: ``gpt`` has no dropout (Megatron's dropout masks and
their memory are not modelled) and no fused kernels; attention is written out (scores
materialised, as the 2019-2022 codes did); ``palm`` has no rotary embeddings or z-loss.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.zoo.gpt import gpt
from autopar.zoo.llama import llama3
from autopar.zoo.palm import palm


@dataclass(frozen=True)
class PublishedRun:
    """A training as its paper reports it. Degrees are totals; ``data_inner`` is the part of the
    data-parallel degree inside the innermost levels that ZeRO shards over when ``zero_inner``
    (PaLM: 256 of 512 in a pod; the 2 pods replicate)."""

    model: str
    cluster: str  # autopar.Cluster preset
    tensor: int
    pipeline: int
    data: int
    zero: int
    recompute: bool | None  # None: not stated, searched
    precision: str
    microbatch_size: int
    utilisation: float  # fraction of peak FLOP/s
    measure: str  # "hardware": counts the recomputed forward; "model": MFU
    figure: str  # the paper's own words and numbers
    source: str
    zero_inner: bool = False  # ZeRO over the data parallelism inside a pod only
    context: int = 1  # context-parallel degree (the sequence split over ranks in attention)
    schedule: str | None = None  # the pipeline schedule it ran (planning/step_price.SCHEDULES)


def megatron_8b(batch=512, seq=1024, width=3072, heads=32, layers=72, vocab=51200, device="meta", seed=0):
    return gpt(batch=batch, seq=seq, width=width, heads=heads, layers=layers, vocab=vocab,
               attention="manual", device=device, seed=seed, tie=True)


def megatron_1t(batch=3072, seq=2048, width=25600, heads=160, layers=128, vocab=51200, device="meta", seed=0):
    return gpt(batch=batch, seq=seq, width=width, heads=heads, layers=layers, vocab=vocab,
               attention="manual", device=device, seed=seed, tie=True)


def mt_nlg_530b(batch=1920, seq=2048, width=20480, heads=128, layers=105, vocab=51200, device="meta", seed=0):
    return gpt(batch=batch, seq=seq, width=width, heads=heads, layers=layers, vocab=vocab,
               attention="manual", device=device, seed=seed, tie=True)


def palm_540b(batch=2048, seq=2048, width=18432, heads=48, head_dim=256, ffn=73728, layers=118,
              vocab=256000, device="meta", seed=0):
    return palm(batch=batch, seq=seq, width=width, heads=heads, head_dim=head_dim, ffn=ffn,
                layers=layers, vocab=vocab, attention="manual", device=device, seed=seed)


def llama3_405b(batch=2048, seq=8192, layers=126, vocab=128256, device="meta", seed=0):
    return llama3("405b", batch=batch, seq=seq, vocab=vocab, device=device, seed=seed, layers=layers)


def llama3_405b_long(batch=128, seq=131072, layers=126, vocab=128256, device="meta", seed=0):
    return llama3("405b", batch=batch, seq=seq, vocab=vocab, device=device, seed=seed, layers=layers)


PUBLISHED = {
    "megatron_8b": PublishedRun(
        "megatron_8b", "32x16xdgx2h", tensor=8, pipeline=1, data=64, zero=0, recompute=True,
        precision="fp16", microbatch_size=8, utilisation=15.1e15 / (512 * 130e12), measure="hardware",
        figure="15.1 PFLOP/s on 512 V100 (130 TFLOP/s peak each): 22.7% of peak; 76% scaling efficiency",
        source="Shoeybi et al. 2019, Megatron-LM, section 5.1"),
    "megatron_1t": PublishedRun(
        "megatron_1t", "384x8xdgxa100", tensor=8, pipeline=64, data=6, zero=0, recompute=True,
        precision="fp16", microbatch_size=1, utilisation=0.52, measure="hardware",
        figure="163 TFLOP/s per A100, 502 PFLOP/s on 3072: 52% of peak",
        source="Narayanan et al. 2021, Table 1", schedule="1f1b"),
    "mt_nlg_530b": PublishedRun(
        "mt_nlg_530b", "420x8xdgxa100", tensor=8, pipeline=35, data=12, zero=1, recompute=True,
        precision="bf16", microbatch_size=1, utilisation=0.362, measure="hardware",
        figure="113 TFLOP/s per A100 on 420 DGX A100: 36.2% of peak",
        source="Smith et al. 2022, MT-NLG, section 3", schedule="1f1b"),
    "palm_540b": PublishedRun(
        "palm_540b", "2x3072xtpuv4", tensor=12, pipeline=1, data=512, zero=3, recompute=True,
        precision="bf16", microbatch_size=4, utilisation=0.462, measure="model",
        figure="46.2% model FLOPs utilisation (57.8% hardware) on 6144 TPU v4",
        source="Chowdhery et al. 2022, PaLM, section 4 and Table 3", zero_inner=True),
    "llama3_405b": PublishedRun(
        "llama3_405b", "2048x8xh100", tensor=8, pipeline=16, data=128, zero=2, recompute=None,
        precision="bf16", microbatch_size=1, utilisation=0.41, measure="model",
        figure="400 TFLOP/s per H100, 41% BF16 MFU on 16,384 GPUs at sequence 8192",
        source="Dubey et al. 2024, The Llama 3 Herd of Models, Table 4", schedule="interleaved-1f1b"),
    "llama3_405b_long": PublishedRun(
        "llama3_405b_long", "2048x8xh100", tensor=8, pipeline=16, data=8, zero=2, recompute=None,
        precision="bf16", microbatch_size=1, utilisation=0.38, measure="model",
        figure="380 TFLOP/s per H100, 38% BF16 MFU on 16,384 GPUs at sequence 131,072 (context parallelism 16)",
        source="Dubey et al. 2024, The Llama 3 Herd of Models, Table 4", context=16,
        schedule="interleaved-1f1b"),
}
