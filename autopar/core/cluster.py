"""The devices a plan runs on: how fast each computes, how much it holds, how fast they talk.

A cluster is ``nodes x devices_per_node`` identical devices. Devices in one node share a fast link
(NVLink, PCIe); nodes are joined by a slower one (InfiniBand). Bandwidths are per device and per
direction, in bytes/s: a ring collective sends one way on every hop, so the one-way figure is the
one that prices it (NVIDIA quotes NVLink as the sum of both directions; we halve it).

Every preset value names its public source below. Latencies are not on any datasheet: they are the
usual order of magnitude of one NCCL/MPI hop (a few microseconds on NVLink/PCIe, ~5-10 us over
InfiniBand) and are marked as assumptions.
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass, field, replace

from autopar.core.tables import Mesh

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
}

# The flat default of ``Cluster(devices=p)``: an A100-80GB's numbers, on one fast fabric (as if
# all p devices shared NVLink), so a plain device count gives realistic, uniform costs.
_DEFAULT = DEVICES["a100"]

# This machine when not measured: a modest CPU core pair; gloo over loopback between processes.
CPU_DEFAULT_FLOPS = 50e9  # fp32 FLOP/s per process (a few AVX2 cores)
CPU_DEFAULT_MEMBW = 10 * GB
CPU_LINK_BANDWIDTH = 2 * GB  # gloo over loopback TCP, per direction (assumption)
CPU_LINK_LATENCY = 50e-6


def _physical_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * GB


def prime_factors(n: int) -> list[int]:
    """12 -> [2, 2, 3]: the mesh axes of n devices (ascending)."""
    out, f = [], 2
    while n > 1:
        while n % f == 0:
            out.append(f)
            n //= f
        f += 1 if f == 2 else 2
        if f * f > n and n > 1:
            out.append(n)
            break
    return out


@dataclass(frozen=True)
class Cluster:
    """``devices`` identical devices, ``devices_per_node`` to a node (0 = all in one node).

    Bandwidths in bytes/s (per device, one direction), latencies in s, capacity in bytes,
    ``peak_flops`` in FLOP/s keyed by torch dtype name ("float32", "bfloat16", ...).
    ``Cluster(devices=p)`` alone: p A100-80GB-like devices on one NVLink-speed fabric.
    """

    devices: int = 1
    devices_per_node: int = 0
    peak_flops: dict[str, float] = field(default_factory=lambda: dict(_DEFAULT.peak_flops))
    memory_bandwidth: float = _DEFAULT.memory_bandwidth
    memory_capacity: float = _DEFAULT.memory_capacity
    intra_bandwidth: float = _DEFAULT.intra_bandwidth
    intra_latency: float = _DEFAULT.intra_latency
    inter_bandwidth: float = _DEFAULT.inter_bandwidth
    inter_latency: float = _DEFAULT.inter_latency
    name: str = ""

    def __post_init__(self) -> None:
        if self.devices < 1:
            raise ValueError(f"Cluster: devices must be >= 1, got {self.devices}")
        per = self.devices_per_node or self.devices
        if self.devices > per and self.devices % per:
            raise ValueError(f"Cluster: {self.devices} devices do not fill whole nodes of {per}")
        object.__setattr__(self, "devices_per_node", min(per, self.devices))
        for what in ("memory_bandwidth", "memory_capacity", "intra_bandwidth", "inter_bandwidth"):
            if not getattr(self, what) > 0:  # also refuses NaN
                raise ValueError(f"Cluster: {what} must be > 0, got {getattr(self, what)!r}")
        for what in ("intra_latency", "inter_latency"):
            if not getattr(self, what) >= 0:
                raise ValueError(f"Cluster: {what} must be >= 0 seconds, got {getattr(self, what)!r}")
        bad = {k: v for k, v in self.peak_flops.items() if not v > 0}
        if not self.peak_flops or bad:
            raise ValueError(f"Cluster: peak_flops needs FLOP/s > 0 per dtype, got {self.peak_flops!r}")
        if not self.name:
            object.__setattr__(self, "name", f"{self.devices}x-device")

    # -- shape ------------------------------------------------------------------------------
    @property
    def nodes(self) -> int:
        return self.devices // self.devices_per_node

    def mesh(self) -> Mesh:
        """Prime-factor mesh; axes that cross node boundaries (level 1) come first.

        Device ``r`` sits at node ``r // devices_per_node``; the mesh is row-major over ranks, so
        the outer (node) factors are exactly the axes whose neighbours live on other nodes.
        """
        outer = prime_factors(self.nodes)
        inner = prime_factors(self.devices_per_node)
        return Mesh(tuple(outer + inner), tuple([1] * len(outer) + [0] * len(inner)))

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``; dtypes the device has no figure for run at its fp32 rate."""
        return self.peak_flops.get(dtype, self.peak_flops.get("float32", max(self.peak_flops.values())))

    def link(self, crosses_nodes: bool) -> tuple[float, float]:
        """(bandwidth, latency) of the slowest hop of a group that does / does not leave a node."""
        if crosses_nodes:
            return self.inter_bandwidth, self.inter_latency
        return self.intra_bandwidth, self.intra_latency

    def describe(self) -> str:
        """One line for reports: what each number is, so a reader can check a cost by hand."""
        pf = ", ".join(f"{k} {v / TFLOP:g} TFLOP/s" for k, v in sorted(self.peak_flops.items()))
        return (f"{self.name}: {self.devices} devices ({self.nodes} node(s) x {self.devices_per_node}); "
                f"peak {pf}; memory {self.memory_capacity / GB:g} GB at {self.memory_bandwidth / GB:g} GB/s; "
                f"intra-node {self.intra_bandwidth / GB:g} GB/s + {self.intra_latency * 1e6:g} us; "
                f"inter-node {self.inter_bandwidth / GB:g} GB/s + {self.inter_latency * 1e6:g} us")

    # -- presets ----------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, devices: int | None = None, measure: bool = False) -> "Cluster":
        """A named cluster.

        ``cpu`` (this machine), and ``[N x][G x]GPU`` for GPU in v100, a100, h100, 1080ti,
        2080ti: ``8xA100`` = one node of 8; ``2x8xH100`` = 2 nodes of 8; a bare ``1080ti`` = one
        node of 8; ``GxGPU`` with G > 8 = G/8 nodes of 8. ``devices=`` overrides the total (whole
        nodes of 8 beyond 8). ``measure=True`` (cpu only) times a matmul and a copy.
        """
        key = name.strip().lower()
        if key == "cpu":
            return cls._cpu(devices, measure)
        m = re.fullmatch(r"(?:(\d+)x)?(?:(\d+)x)?([a-z0-9]+)", key)
        gpu = m.group(3) if m else ""
        if not m or gpu not in DEVICES:
            raise ValueError(f"unknown cluster preset {name!r}; known: {', '.join(known_presets())} "
                             "(and N x G x GPU patterns such as 2x8xH100)")
        a, b = m.group(1), m.group(2)
        if b is not None:
            nodes, per = int(a), int(b)
        elif a is not None:
            total = int(a)
            per = total if total <= 8 else 8
            if total > 8 and total % 8:
                raise ValueError(f"cluster {name!r}: {total} GPUs do not fill nodes of 8; "
                                 "write NxGxGPU")
            nodes = max(1, total // per)
        else:
            nodes, per = 1, 8
        total = nodes * per
        if devices is not None:
            total = devices
            per = min(per if b is not None else 8, devices)
        dev = DEVICES[gpu]
        label = name if devices is None else f"{name}@{devices}"
        return cls(devices=total, devices_per_node=per, peak_flops=dict(dev.peak_flops),
                   memory_bandwidth=dev.memory_bandwidth, memory_capacity=dev.memory_capacity,
                   intra_bandwidth=dev.intra_bandwidth, intra_latency=dev.intra_latency,
                   inter_bandwidth=dev.inter_bandwidth, inter_latency=dev.inter_latency,
                   name=label)

    @classmethod
    def _cpu(cls, devices: int | None, measure: bool) -> "Cluster":
        n = devices or (os.cpu_count() or 1)
        flops, membw = CPU_DEFAULT_FLOPS, CPU_DEFAULT_MEMBW
        if measure:
            flops, membw = measure_cpu()
        return cls(devices=n, devices_per_node=n, peak_flops={"float32": flops},
                   memory_bandwidth=membw, memory_capacity=_physical_memory() / n,
                   intra_bandwidth=CPU_LINK_BANDWIDTH, intra_latency=CPU_LINK_LATENCY,
                   inter_bandwidth=CPU_LINK_BANDWIDTH, inter_latency=CPU_LINK_LATENCY,
                   name="cpu" + (" (measured)" if measure else ""))

    def with_devices(self, devices: int) -> "Cluster":
        return replace(self, devices=devices, devices_per_node=min(self.devices_per_node, devices))


def known_presets() -> list[str]:
    return ["cpu", "8xV100", "8xA100", "8xH100", "2x8xH100", "8x8xH100", "1080ti", "2080ti"]


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
