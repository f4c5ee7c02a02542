"""Hardware datasheets: the devices, links and measured fractions the cluster presets are built from.

Bandwidths are per device and per direction, in bytes/s: a ring collective sends one way on every
hop, so the one-way figure is the one that prices it (NVIDIA quotes NVLink as the sum of both
directions; we halve it). Every value names its public source beside it. Latencies are not on any
datasheet: they are the usual order of magnitude of one NCCL/MPI hop (a few microseconds on
NVLink/PCIe, ~5-10 us over InfiniBand) and are marked as assumptions.

The machines of published trainings (``dgx2h``, ``dgxa100``, ``tpuv4``) carry *achievable*
figures where a measurement is public: link bandwidths are what NCCL-style collectives reach
(datasheet x measured fraction, both cited), and ``compute_efficiency`` is the fraction of peak
FLOP/s large matmuls reach on the device, which the analytic model then uses instead of its
default. The older devices keep datasheet figures. ``core.cluster`` builds a ``Cluster`` from these.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

GB = 1e9
TFLOP = 1e12

# Links (bytes/s per device, one direction) -------------------------------------------------------
# NVLink 2 (V100 SXM2): 300 GB/s total over 6 links, both directions (NVIDIA V100 datasheet).
NVLINK2 = 150 * GB
# NVLink 3 (A100 SXM4): 600 GB/s GPU-to-GPU, both directions; "300+300 GB/s" (NVIDIA A100
# datasheet; glennklockwood.com/garden/processors/A100).
NVLINK3 = 300 * GB
# NVLink 4 (H100 SXM5): 900 GB/s, both directions (NVIDIA H100 datasheet; glennklockwood.com).
NVLINK4 = 450 * GB
# PCIe 3.0 x16: 8 GT/s x 16 lanes x 128/130 encoding = 15.75 GB/s each way (PCI-SIG 3.0 spec).
PCIE3_X16 = 15.75 * GB
# InfiniBand EDR: 100 Gb/s per port = 12.5 GB/s each way (InfiniBand Trade Association roadmap).
IB_EDR = 12.5 * GB
# InfiniBand NDR: 400 Gb/s per port = 50 GB/s each way; DGX H100 has one NDR port per GPU.
IB_NDR = 50 * GB

# InfiniBand HDR: 200 Gb/s per port = 25 GB/s each way (InfiniBand Trade Association roadmap).
IB_HDR = 25 * GB
# Measured fractions of link peaks reached by NCCL collectives (bus bandwidth):
# - 8x A100 SXM4 on NVLink 3/NVSwitch: ~200 GB/s all-reduce busbw of 300 GB/s one way
#   (NVIDIA/nccl-tests issue #149, nccl-tests issue #178: 208 GB/s) -> 2/3.
NVSWITCH_FRACTION = 200 / 300
# - InfiniBand HDR, 3 nodes of 8x A100 with 4 HDR ports each: busbw 84.8 GB/s on average, 96 GB/s
#   at best, of 100 GB/s per node (NVIDIA/nccl-tests issue #119) -> 0.9.
IB_FRACTION = 0.9

# Latencies (s): assumptions, see the module docstring.
NVLINK_LATENCY = 3e-6
PCIE_LATENCY = 5e-6
IB_LATENCY = 7e-6


@dataclass(frozen=True)
class Device:
    """One accelerator model: its peak FLOP/s per dtype, memory bandwidth and capacity."""

    name: str
    peak_flops: dict[str, float]
    memory_bandwidth: float  # bytes/s
    memory_capacity: float  # bytes
    intra_bandwidth: float  # bytes/s per device, one direction, within a node
    intra_latency: float
    inter_bandwidth: float  # bytes/s per device, one direction, between nodes
    inter_latency: float
    per_node: int = 8  # devices in one node (a bare preset name is one node of these)
    compute_efficiency: float = 0.0  # measured fraction of peak large matmuls reach; 0: the model's
    pod_nodes: int = 0  # nodes per pod (0: one pod)
    pod_bandwidth: float = 0.0  # bytes/s per device between pods
    pod_latency: float = 0.0


# float32 matmuls: PyTorch keeps TF32 off for matmuls by default (torch.backends.cuda.matmul.
# allow_tf32 = False since 1.12), so fp32 is priced at the plain FP32 rate, TF32 listed apart.
DEVICES: dict[str, Device] = {
    # NVIDIA Tesla V100 SXM2 datasheet: 15.7 TFLOP/s FP32, 125 TFLOP/s fp16 tensor core,
    # 900 GB/s HBM2, 32 GB (16 GB variant exists), NVLink 300 GB/s. Nodes: DGX-1 style, 4x EDR.
    "v100": Device("V100-SXM2", {"float32": 15.7 * TFLOP, "float16": 125 * TFLOP,
                                 "bfloat16": 15.7 * TFLOP, "float64": 7.8 * TFLOP},
                   900 * GB, 32 * GB, NVLINK2, NVLINK_LATENCY, IB_EDR, IB_LATENCY),
    # NVIDIA A100 80GB SXM datasheet: 19.5 FP32, 156 TF32 (dense), 312 BF16/FP16 (dense),
    # 2,039 GB/s HBM2e, 80 GB, NVLink 600 GB/s. Nodes: DGX A100, one HDR 200 Gb/s port per GPU.
    "a100": Device("A100-SXM4-80GB", {"float32": 19.5 * TFLOP, "tf32": 156 * TFLOP,
                                      "bfloat16": 312 * TFLOP, "float16": 312 * TFLOP,
                                      "float64": 19.5 * TFLOP},
                   2039 * GB, 80 * GB, NVLINK3, NVLINK_LATENCY, 25 * GB, IB_LATENCY),
    # NVIDIA H100 SXM5 datasheet: 67 FP32, 989 BF16/FP16 dense (1,979 with sparsity), 495 TF32
    # dense, 3.35 TB/s HBM3, 80 GB, NVLink 900 GB/s; DGX H100: 400 Gb/s NDR InfiniBand per GPU.
    "h100": Device("H100-SXM5-80GB", {"float32": 67 * TFLOP, "tf32": 494.7 * TFLOP,
                                      "bfloat16": 989.4 * TFLOP, "float16": 989.4 * TFLOP,
                                      "float64": 67 * TFLOP},
                   3350 * GB, 80 * GB, NVLINK4, NVLINK_LATENCY, IB_NDR, IB_LATENCY),
    # GeForce GTX 1080 Ti (NVIDIA spec page): 11.3 TFLOP/s FP32, 484 GB/s GDDR5X, 11 GB.
    # fp16 runs at 1/64 rate on GP102, so half precision is no faster: priced at fp32.
    # PaSE's cluster: PCIe 3.0 x16 in a node, EDR InfiniBand between nodes (brief; PaSE paper).
    "1080ti": Device("GTX-1080Ti", {"float32": 11.3 * TFLOP, "float16": 11.3 * TFLOP / 64},
                     484 * GB, 11 * GB, PCIE3_X16, PCIE_LATENCY, IB_EDR, IB_LATENCY),
    # GeForce RTX 2080 Ti (NVIDIA spec page / TechPowerUp): 13.4 TFLOP/s FP32, 616 GB/s GDDR6,
    # 11 GB; fp16 non-tensor 26.9 TFLOP/s. PaSE's cluster: PCIe 3.0 x16 + EDR InfiniBand.
    "2080ti": Device("RTX-2080Ti", {"float32": 13.4 * TFLOP, "float16": 26.9 * TFLOP},
                     616 * GB, 11 * GB, PCIE3_X16, PCIE_LATENCY, IB_EDR, IB_LATENCY),
    # --- machines of published trainings, achievable figures ---------------------------
    # NVIDIA DGX-2H (Megatron-LM, Shoeybi et al. 2019, section 5: "32 DGX-2H servers (a total of 512
    # Tesla V100 SXM3 32GB GPUs) ... 300 GB/sec bandwidth between GPUs inside a server via NVSwitch
    # and 100 GB/sec of interconnect bandwidth between servers using 8 InfiniBand adapters per
    # server"). 16 GPUs per node. Peak: the paper's 39 TFLOP/s "is 30% of the theoretical peak",
    # i.e. 130 TFLOP/s fp16 per V100 SXM3 at the DGX-2H's 450 W clocks (DGX-2H datasheet: 2.1
    # PFLOPS for 16 GPUs); fp32 16.4 TFLOP/s (same clocks, V100 ratio 1:8); 32 GB HBM2 at 900 GB/s
    # (V100 datasheet). NVSwitch: 150 GB/s one way x NVSWITCH_FRACTION (the A100 measurement; an
    # assumption for V100). IB: 8 x 100 Gb/s EDR for 16 GPUs = 6.25 GB/s per GPU x IB_FRACTION.
    # compute_efficiency: what the paper's own single-GPU baseline implies for its matmuls. That
    # baseline (section 5.1: the 1.2B model, hidden 1536, 40 layers, 16 heads, sequence 1024; batch 8,
    # the 8.3B run's per-replica batch; fp16, recomputation) runs at 39 of 130 TFLOP/s = 30% end to
    # end, memory-bound kernels and the optimizer step included; the analytic model prices those
    # apart, so the matmul fraction is the one at which it predicts that baseline at 30%: 0.386
    # (tests/planning/test_published.py re-derives it). The kernels of that code on that GPU,
    # which multi-device planning does not change.
    "dgx2h": Device("V100-SXM3-32GB (DGX-2H)", {"float32": 16.4 * TFLOP, "float16": 130 * TFLOP},
                    900 * GB, 32 * GB, 150 * GB * NVSWITCH_FRACTION, NVLINK_LATENCY,
                    8 * IB_EDR / 16 * IB_FRACTION, IB_LATENCY, per_node=16, compute_efficiency=0.386),
    # NVIDIA DGX A100 80GB with one HDR 200 Gb/s InfiniBand port per GPU (Selene; Narayanan et al.
    # 2021 and Smith et al. 2022 section 3: "8 NVIDIA 80-GB A100 GPUs ... NVLink and NVSwitch ...
    # HDR InfiniBand"). A100 80GB SXM datasheet figures as "a100" above; NVLink x NVSWITCH_FRACTION,
    # HDR x IB_FRACTION. compute_efficiency: bf16 matmul reaches 271.2 of 312 TFLOP/s = 0.869 at its
    # best shape (maximum achievable matmul FLOPS, stas00/ml-engineering, compute/accelerator).
    "dgxa100": Device("A100-SXM4-80GB (DGX A100, HDR IB)",
                      {"float32": 19.5 * TFLOP, "tf32": 156 * TFLOP, "bfloat16": 312 * TFLOP,
                       "float16": 312 * TFLOP, "float64": 19.5 * TFLOP},
                      2039 * GB, 80 * GB, NVLINK3 * NVSWITCH_FRACTION, NVLINK_LATENCY,
                      IB_HDR * IB_FRACTION, IB_LATENCY, per_node=8, compute_efficiency=0.869),
    # Google TPU v4 (Cloud TPU v4 documentation, "Key specifications"): 275 TFLOP/s bf16 per chip,
    # 32 GiB HBM2 at 1200 GB/s, pods of 4096 chips on a 3-D torus of inter-chip links (ICI) with
    # 1.1 PB/s all-reduce bandwidth per pod. As an equivalent hierarchy, a "node" is the ICI domain
    # (one pod slice: PaLM used 3072 chips per pod, Chowdhery et al. 2022 section 4) and pods are
    # joined by the data-centre network (DCN). ICI per chip: 1.1 PB/s / 4096 = 268.6 GB/s. DCN per
    # chip: an assumption, 100 Gb/s per host of 4 chips = 3.125 GB/s (PaLM section 4 describes the
    # cross-pod gradient transfer over DCN as bursty and does not give a per-chip figure here).
    # Latencies: ICI 5 us, DCN 25 us (assumptions). fp32 matmuls run as bf16 passes on the MXU:
    # no separate fp32 figure, fp32 priced at bf16 / 4 (an assumption; plans here use bf16).
    # compute_efficiency 0.869: the A100's measured matmul fraction, an assumption for the MXU (no
    # public single-chip matmul measurement was found).
    "tpuv4": Device("TPU-v4", {"float32": 275 / 4 * TFLOP, "bfloat16": 275 * TFLOP},
                    1200 * GB, 32 * 2 ** 30, 1.1e15 / 4096, 5e-6, 100e9 / 8 / 4, 25e-6,
                    per_node=4096, compute_efficiency=0.869),
}

# The flat default of ``Cluster(devices=p)``: an A100-80GB's numbers, on one fast fabric (as if
# all p devices shared NVLink), so a plain device count gives realistic, uniform costs.
DEFAULT_DEVICE = DEVICES["a100"]

# The local machine when not measured: one process per core, gloo over loopback between processes.
# Measured on the benchmarks' machine (benchmarks/README.md) (AMD EPYC, torch 2.13 CPU, one thread per process,
# both processes running at once): ``measure_cpu(1024)`` 86 GFLOP/s and 27 GB/s per process
# (2026-11-24). Links (2026-11-25): ``cost_models.collective_fit.fit_collectives`` on 2 gloo processes,
# each all-reduce timed as a step meets it (after 1 ms of matmul, the mean of a burst, not the
# median of a tight loop: a tight loop gave 160 us per ring step, which priced a plan with many
# blocking reshards at half its measured time): 680-1060 us per ring step, 0.9-1.8 GB/s over ten
# fits (runs vary; the round figures below sit inside them; the fit now times each collective after
# 4 ms of work and gets 1.4-2.1 ms per step, 1.2-1.8 GB/s: kept here, as the preset's MLP speed-up
# predicted with them, 1.35x, is no nearer the measured 1.5-1.6x than 1.68x is). ``Cluster.preset("cpu",
# measure=True)`` re-measures compute; ``--cost-model profiled`` fits the links on the live group.
CPU_DEFAULT_FLOPS = 85e9  # fp32 FLOP/s per process
CPU_DEFAULT_MEMBW = 27 * GB
# The host work every op of a training step costs on one CPU thread whatever its size (torch's
# dispatch, autograd's bookkeeping, the generated program's Python, the update's per-tensor work),
# per forward-equivalent (a node's forward pays it once, its backward twice): the zoo gpt at
# vanishing size (layers 2, width 16, seq 8, vocabulary 32: 48 nodes, their roofline terms 0.68
# ms) ran rank 0 of its 8-device plan over the fake process group in 5.18 ms of thread CPU time a
# step, communication excluded (2026-11-27, ``autopar measure``, load 16): (5.18 - 0.68) ms / (48 x
# 3) = 31 us. Torch's own share is 3 us a forward and 8-16 us a forward and backward (a chain of
# 64 tiny multiplications or linears); the rest is the program around the ops.
CPU_OP_OVERHEAD = 30e-6
CPU_LINK_BANDWIDTH = 1 * GB  # gloo over loopback TCP, per direction
CPU_LINK_LATENCY = 800e-6
# 4 gloo processes on the 2 cores: a process the scheduler parked is waited for, once per
# collective more than per ring step. Timed in isolation (2026-11-25, after 2.4 ms of matmul on
# each side of a barrier, median of 40; all-reduce, all-gather, reduce-scatter over groups of 2
# and 4, 4 KiB to 512 KiB, two runs): a least-squares fit gives 1.16 ms per collective + 0.88 ms
# per ring step + 1.13 GB/s (0.45 ms rms, 27% at worst), where ring steps alone fit at 1.11 ms
# each (0.72 ms rms, 60% at worst: a 2-rank all-gather, one step, costs about what a 2-rank
# all-reduce, two, does; a 4-rank all-reduce, six, about twice a 2-rank one). That split decides
# plans: three small collectives cost more than one over the same four ranks.
CPU_OVERSUBSCRIBED_LATENCY = 900e-6
CPU_OVERSUBSCRIBED_CALL = 1150e-6
# gloo's all-gather beside its all-reduce, the same fit with a line of its own (2026-11-25, two
# fits of 2 processes, 4 KiB to 16 MiB): 0.85 and 0.93 GB/s against 1.48 and 1.63 GB/s, 815 and
# 925 us per step against 800 and 819 us
CPU_GATHER_FACTORS = (("all-gather", 0.57, 1.0),)


def physical_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * GB


def measure_cpu(size: int = 512, copy_mb: int = 64, reps: int = 3) -> tuple[float, float]:
    """(fp32 matmul FLOP/s, memcpy bytes/s) of this process, best of ``reps``; well under 1 s."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)  # warm-up
    best = math.inf
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    flops = 2 * size ** 3 / max(best, 1e-9)
    src = torch.empty(copy_mb * 2 ** 20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = math.inf
    for _ in range(reps):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    membw = 2 * src.numel() * 4 / max(best, 1e-9)  # a copy reads and writes every byte
    return flops, membw
