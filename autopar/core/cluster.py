"""The devices a plan runs on: how fast each computes, how much it holds, how fast they talk.

A cluster is ``nodes x devices_per_node`` identical devices. Devices in one node share a fast link
(NVLink, PCIe); nodes are joined by a slower one (InfiniBand). Bandwidths are per device and per
direction, in bytes/s. The figures of each device and link, with their sources, are in
``core.hardware``; ``Cluster.preset`` builds a cluster from them.

Levels. A cluster is a hierarchy: devices in a node (level 0), nodes in a pod (level 1), pods
(level 2, ``nodes_per_pod`` > 0). The flat prime-factor mesh sees two levels (a pod-crossing axis
is priced as inter-node); the hierarchical search (``autopar/planning/hierarchical.py``) reads all
three through ``levels()``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace

from autopar.core.hardware import (CPU_DEFAULT_FLOPS, CPU_DEFAULT_MEMBW, CPU_GATHER_FACTORS,  # noqa: F401
                                   CPU_LINK_BANDWIDTH, CPU_LINK_LATENCY, CPU_OVERSUBSCRIBED_CALL,
                                   CPU_OVERSUBSCRIBED_LATENCY, DEFAULT_DEVICE, DEVICES, GB, IB_EDR,
                                   IB_FRACTION, IB_HDR, IB_LATENCY, IB_NDR, NVLINK2, NVLINK3, NVLINK4,
                                   NVLINK_LATENCY, NVSWITCH_FRACTION, PCIE3_X16,
                                   PCIE_LATENCY, TFLOP, Device, measure_cpu, physical_memory)
from autopar.core.tables import Mesh

# the collectives a cost model prices (``cost_models.alpha_beta`` holds their formulas)
COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "broadcast", "send/recv")


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


def _rate(seconds_per_byte: float) -> str:
    return f"{1 / seconds_per_byte / GB:.3g} GB/s" if seconds_per_byte > 0 else "no cost"


@dataclass(frozen=True)
class Cluster:
    """``devices`` identical devices, ``devices_per_node`` to a node (0 = all in one node).

    Bandwidths in bytes/s (per device, one direction), latencies in s, capacity in bytes,
    ``peak_flops`` in FLOP/s keyed by torch dtype name ("float32", "bfloat16", ...).
    ``Cluster(devices=p)`` alone: p A100-80GB-like devices on one NVLink-speed fabric.
    """

    devices: int = 1
    devices_per_node: int = 0
    peak_flops: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_DEVICE.peak_flops))
    memory_bandwidth: float = DEFAULT_DEVICE.memory_bandwidth
    memory_capacity: float = DEFAULT_DEVICE.memory_capacity
    intra_bandwidth: float = DEFAULT_DEVICE.intra_bandwidth
    intra_latency: float = DEFAULT_DEVICE.intra_latency
    inter_bandwidth: float = DEFAULT_DEVICE.inter_bandwidth
    inter_latency: float = DEFAULT_DEVICE.inter_latency
    name: str = ""
    compute_efficiency: float = 0.0  # measured fraction of peak FLOP/s; 0: the cost model's default
    nodes_per_pod: int = 0  # 0: all nodes in one pod
    pod_bandwidth: float = 0.0  # bytes/s per device between pods (0: the inter-node figure)
    pod_latency: float = 0.0
    # True: the mesh keeps the nodes as one axis instead of their prime factors (the hierarchical
    # search's tensor groups: a split across nodes takes them all, in-node splits stay fine-grained)
    node_axis: bool = False
    backend: str = ""  # "gloo": collectives priced as a CPU process group runs them (cost_models.alpha_beta.as_run)
    # (kind, bandwidth factor, latency factor): a collective the backend runs slower (or faster)
    # than its all-reduce, whose figures the links hold. gloo's all-gather moves about half the
    # bytes per second of its all-reduce (``cost_models.collective_fit.fit_collectives`` fits both on
    # the live group and sets this); () prices every kind on the links as they are.
    kind_factors: tuple[tuple[str, float, float], ...] = ()
    # seconds every collective (p > 1) pays once on top of its per-step latency: the wait for
    # processes the scheduler parked where more processes than cores share them (the cpu preset
    # past its cores); 0 where each device runs on its own
    call_latency: float = 0.0
    # what a reshard step costs a rank beyond its collective, where measured (0: not priced): the
    # runtime's path per step (Python, the autograd function, the mesh's group lookups), seconds,
    # and the local copy around the collective, seconds per byte of the collective's buffer:
    # ``copy_time`` for an all-reduce's plain copy, ``strided_copy_time`` for the block copies of
    # gathers, scatters and all-to-alls (``cost_models.alpha_beta.reshard_local``)
    move_call: float = 0.0
    copy_time: float = 0.0
    strided_copy_time: float = 0.0
    # seconds of host work every node's op costs whatever its size (the framework's dispatch, the
    # program's Python, autograd's bookkeeping), added to its forward's roofline time (and so
    # ``backward_factor`` times to its backward). Where the host runs each op as it is called (a
    # CPU), it is part of the step; 0 where a device runs queued kernels while the host issues the
    # next ones (GPUs: the launches hide behind the device's work once it is busy)
    op_overhead: float = 0.0
    # True: the optimizer's update runs as torch's own foreach or per-tensor ops, each a pass over
    # whole fp32 tensors (``cost_models.training.UPDATE_PASSES``: AdamW 21), as the generated
    # module's ``optimizer()`` runs it; False: one fused kernel that moves each tensor once (the
    # fused Adam the published GPU trainings ran)
    foreach_update: bool = False

    def __post_init__(self) -> None:
        if self.devices < 1:
            raise ValueError(f"Cluster: devices must be >= 1, got {self.devices}")
        per = self.devices_per_node or self.devices
        if self.devices > per and self.devices % per:
            raise ValueError(f"Cluster: {self.devices} devices do not fill whole nodes of {per}")
        object.__setattr__(self, "devices_per_node", min(per, self.devices))
        nodes = self.devices // self.devices_per_node
        if self.nodes_per_pod and (self.nodes_per_pod >= nodes or nodes % self.nodes_per_pod):
            if nodes % max(self.nodes_per_pod, 1):
                raise ValueError(f"Cluster: {nodes} nodes do not fill whole pods of {self.nodes_per_pod}")
            object.__setattr__(self, "nodes_per_pod", 0)  # one pod
        if not 0 <= self.compute_efficiency <= 1:
            raise ValueError(f"Cluster: compute_efficiency is a fraction of peak in [0, 1], not "
                             f"{self.compute_efficiency!r}")
        for what in ("memory_bandwidth", "memory_capacity", "intra_bandwidth", "inter_bandwidth"):
            if not getattr(self, what) > 0:  # also refuses NaN
                raise ValueError(f"Cluster: {what} must be > 0, got {getattr(self, what)!r}")
        for what in ("intra_latency", "inter_latency", "call_latency", "move_call", "copy_time", "strided_copy_time",
                     "op_overhead"):
            if not getattr(self, what) >= 0:
                raise ValueError(f"Cluster: {what} must be >= 0 seconds, got {getattr(self, what)!r}")
        factors = tuple((str(k), float(b), float(a)) for k, b, a in self.kind_factors)
        object.__setattr__(self, "kind_factors", factors)  # lists from a plan file, as tuples
        unknown = [k for k, _, _ in factors if k not in COLLECTIVE_KINDS]
        if unknown:
            raise ValueError(f"Cluster: kind_factors name unknown collectives {unknown}; known: "
                             f"{', '.join(COLLECTIVE_KINDS)}")
        if any(not (b > 0 and a > 0) for _, b, a in factors):
            raise ValueError(f"Cluster: kind_factors need factors > 0, got {factors!r}")
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
        outer = [self.nodes] if self.node_axis and self.nodes > 1 else prime_factors(self.nodes)
        inner = prime_factors(self.devices_per_node)
        return Mesh(tuple(outer + inner), tuple([1] * len(outer) + [0] * len(inner)))

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``; dtypes the device has no figure for run at its fp32 rate."""
        return self.peak_flops.get(dtype, self.peak_flops.get("float32", max(self.peak_flops.values())))

    def link(self, crosses_nodes: bool | int) -> tuple[float, float]:
        """(bandwidth, latency) of the slowest hop of a group that does / does not leave a node;
        an int is the highest level the group spans (2: it leaves a pod)."""
        if int(crosses_nodes) >= 2 and self.nodes_per_pod:
            return self.pod_bandwidth or self.inter_bandwidth, self.pod_latency or self.inter_latency
        if crosses_nodes:
            return self.inter_bandwidth, self.inter_latency
        return self.intra_bandwidth, self.intra_latency

    def kind_link(self, kind: str, bandwidth, latency):
        """``(bandwidth, latency)`` of a link as ``kind`` meets it (``kind_factors``); works on
        numpy arrays too."""
        for k, b, a in self.kind_factors:
            if k == kind:
                return bandwidth * b, latency * a
        return bandwidth, latency

    @property
    def pods(self) -> int:
        return self.nodes // self.nodes_per_pod if self.nodes_per_pod else 1

    def levels(self) -> list[int]:
        """Sizes of the levels, innermost first: [devices per node, nodes per pod, pods], without
        the trailing levels of size 1 (at least one level)."""
        per_pod = self.nodes_per_pod or self.nodes
        out = [self.devices_per_node, per_pod, self.pods]
        while len(out) > 1 and out[-1] == 1:
            out.pop()
        return out

    def describe(self) -> str:
        """One line for reports: what each number is, so a reader can check a cost by hand."""
        pf = ", ".join(f"{k} {v / TFLOP:g} TFLOP/s" for k, v in sorted(self.peak_flops.items()))
        pods = (f"; between pods of {self.nodes_per_pod} nodes {self.link(2)[0] / GB:.4g} GB/s + "
                f"{self.link(2)[1] * 1e6:g} us" if self.nodes_per_pod else "")
        eff = f"; compute at {self.compute_efficiency:g} of peak (measured)" if self.compute_efficiency else ""
        kinds = "".join(f"; {k} at {b:.3g}x the bandwidth, {a:.3g}x the latency" for k, b, a in self.kind_factors)
        if self.call_latency:
            kinds += f"; every collective + {self.call_latency * 1e6:g} us once"
        if self.move_call or self.copy_time or self.strided_copy_time:
            kinds += (f"; every reshard step + {self.move_call * 1e6:.3g} us and its buffer copied at "
                      f"{_rate(self.copy_time)} (plain), {_rate(self.strided_copy_time)} (strided)")
        if self.op_overhead:
            eff += f"; every op + {self.op_overhead * 1e6:g} us of host work"
        return (f"{self.name}: {self.devices} devices ({self.nodes} node(s) x {self.devices_per_node}); "
                f"peak {pf}; memory {self.memory_capacity / GB:g} GB at {self.memory_bandwidth / GB:g} GB/s; "
                f"intra-node {self.intra_bandwidth / GB:.4g} GB/s + {self.intra_latency * 1e6:g} us; "
                f"inter-node {self.inter_bandwidth / GB:.4g} GB/s + {self.inter_latency * 1e6:g} us{pods}{kinds}{eff}")

    # -- presets ----------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, devices: int | None = None, measure: bool = False) -> "Cluster":
        """A named cluster.

        ``cpu`` (the local machine), and ``[N x][G x]GPU`` for GPU one of ``DEVICES``: ``8xA100`` =
        one node of 8; ``2x8xH100`` = 2 nodes of 8; a bare ``1080ti`` = one node of its size (8;
        16 for ``dgx2h``); ``GxGPU`` with G larger than a node = whole nodes. ``devices=``
        overrides the total (whole nodes beyond one). ``tpuv4`` pods: ``2x3072xtpuv4`` = 2 pods
        (ICI domains) of 3072 chips. ``measure=True`` (cpu only) times a matmul and a copy.
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
        dev = DEVICES[gpu]
        node = dev.per_node
        if b is not None:
            nodes, per = int(a), int(b)
        elif a is not None:
            total = int(a)
            per = total if total <= node else node
            if total > node and total % node:
                raise ValueError(f"cluster {name!r}: {total} GPUs do not fill nodes of {node}; "
                                 "write NxGxGPU")
            nodes = max(1, total // per)
        else:
            nodes, per = 1, node
        total = nodes * per
        if devices is not None:
            total = devices
            per = min(per if b is not None else node, devices)
        label = name if devices is None else f"{name}@{devices}"
        return cls(devices=total, devices_per_node=per, peak_flops=dict(dev.peak_flops),
                   memory_bandwidth=dev.memory_bandwidth, memory_capacity=dev.memory_capacity,
                   intra_bandwidth=dev.intra_bandwidth, intra_latency=dev.intra_latency,
                   inter_bandwidth=dev.inter_bandwidth, inter_latency=dev.inter_latency,
                   name=label, compute_efficiency=dev.compute_efficiency,
                   nodes_per_pod=dev.pod_nodes, pod_bandwidth=dev.pod_bandwidth,
                   pod_latency=dev.pod_latency)

    @classmethod
    def _cpu(cls, devices: int | None, measure: bool) -> "Cluster":
        """The local machine, one process per device. More processes than cores share them: each
        computes at cores/devices of a core's speed, and every collective waits for processes the
        scheduler has parked (``CPU_OVERSUBSCRIBED_LATENCY``)."""
        cores = os.cpu_count() or 1
        n = devices or cores
        flops, membw = CPU_DEFAULT_FLOPS, CPU_DEFAULT_MEMBW
        if measure:
            flops, membw = measure_cpu()
        share = min(1.0, cores / n)
        latency = CPU_LINK_LATENCY if n <= cores else CPU_OVERSUBSCRIBED_LATENCY
        call = 0.0 if n <= cores else CPU_OVERSUBSCRIBED_CALL
        return cls(devices=n, devices_per_node=n, peak_flops={"float32": flops * share},
                   memory_bandwidth=membw * share, memory_capacity=physical_memory() / n,
                   intra_bandwidth=CPU_LINK_BANDWIDTH, intra_latency=latency,
                   inter_bandwidth=CPU_LINK_BANDWIDTH, inter_latency=latency,
                   name="cpu" + (" (measured)" if measure else ""), backend="gloo",
                   kind_factors=CPU_GATHER_FACTORS, call_latency=call)

    def with_devices(self, devices: int) -> "Cluster":
        return replace(self, devices=devices, devices_per_node=min(self.devices_per_node, devices))


def known_presets() -> list[str]:
    return ["cpu", "8xV100", "8xA100", "8xH100", "2x8xH100", "8x8xH100", "1080ti", "2080ti",
            "32x16xdgx2h", "384x8xdgxa100", "2x3072xtpuv4"]
