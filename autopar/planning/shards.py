"""Models too large for one device, cut into shards by the memory model (Hydra's shard
parallelism), and the one-model-at-a-time model parallelism it is compared with.

Hydra runs a too-large model one shard at a time on one device: the other shards' parameters,
gradients and optimizer state wait in host memory, and while one shard computes the next one is
copied in (double buffering), so a copy costs time only where it is longer than the compute it
hides behind. Hydra finds shard sizes by trial runs until out-of-memory; here the memory model
gives every node's bytes (``cost_models.memory``), and the node sequence is cut greedily so
that every shard holds at most half a device: the running shard and the prefetched one always
fit together. Compute times are the cost model's per node on one device, each node's forward
and backward apart (its terms), so a shard's forward and backward tasks are priced separately.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.core.cluster import Cluster
from autopar.core.errors import InfeasibleError
from autopar.core.ir import Graph

PCIE4_X16 = 25e9  # bytes/s host <-> device, one direction (PCIe 4.0 x16: 31.5 GB/s peak, ~25 in practice)


@dataclass(frozen=True)
class NodeProfile:
    forward: float  # seconds on one device
    backward: float  # the rest of its training cost (backward, optimizer update)
    params: float  # bytes
    state: float  # parameters + gradients + optimizer state, bytes
    activations: float  # bytes saved for backward


@dataclass(frozen=True)
class Shard:
    start: int  # nodes [start, stop) of the graph's order
    stop: int
    forward: float
    backward: float
    params: float
    state: float
    activations: float

    @property
    def memory(self) -> float:
        return self.state + self.activations


@dataclass
class ShardPlan:
    shards: list[Shard]
    capacity: float
    host_bandwidth: float
    step_seconds: float  # one training step, copies overlapped with compute (prefetch)
    serial_seconds: float  # the same step with every copy waited for

    @property
    def count(self) -> int:
        return len(self.shards)

    def describe(self) -> str:
        most = max(s.memory for s in self.shards)
        return (f"{self.count} shards (largest {most / 2**30:.3g} GiB of {self.capacity / 2**30:.3g} GiB per device), "
                f"one step {self.step_seconds:.4g} s with prefetch, {self.serial_seconds:.4g} s without")


def node_profiles(graph: Graph, cluster: Cluster, cost_model=None, optimizer: str | None = "adam",
                  mode: str = "train") -> list[NodeProfile]:
    """Every node's forward and remaining seconds and its bytes, alone on one device."""
    from autopar.core.space import configs_for
    from autopar.cost_models.analytic import AnalyticModel
    from autopar.cost_models.memory import plan_memory

    one = cluster.with_devices(1)
    model = cost_model or AnalyticModel()
    mesh = one.mesh()
    configs = {n.name: configs_for(n, mesh, "mesh")[0] for n in graph.nodes}
    _, memory = plan_memory(graph, configs, mesh, mode, optimizer)
    out = []
    for n in graph.nodes:
        terms = model.node_breakdown(n, configs[n.name], one, mode, text=False).terms
        fwd = sum(t.seconds for t in terms if t.label.startswith("compute forward"))
        rest = sum(t.seconds for t in terms) - fwd
        m = memory[n.name]
        out.append(NodeProfile(fwd, rest, m.params, m.params + m.grads + m.optimizer, m.activations))
    return out


def cut_shards(profiles: list[NodeProfile], capacity: float, host_bandwidth: float = PCIE4_X16) -> ShardPlan:
    """Cut the node sequence into the fewest shards of at most ``capacity / 2`` bytes each."""
    half = capacity / 2
    shards, start, acc = [], 0, 0.0
    for i, p in enumerate(profiles):
        size = p.state + p.activations
        if size > half:
            raise InfeasibleError(f"one node needs {size / 2**30:.3g} GiB, more than half a device "
                                  f"({half / 2**30:.3g} GiB): a shard cannot hold it beside the next one; "
                                  "split the model's layers or use larger devices", size)
        if acc + size > half and i > start:
            shards.append(_shard(profiles, start, i))
            start, acc = i, 0.0
        acc += size
    if start < len(profiles):
        shards.append(_shard(profiles, start, len(profiles)))
    step, serial = shard_step(shards, host_bandwidth)
    return ShardPlan(shards, capacity, host_bandwidth, step, serial)


def _shard(profiles: list[NodeProfile], a: int, b: int) -> Shard:
    ps = profiles[a:b]
    return Shard(a, b, sum(p.forward for p in ps), sum(p.backward for p in ps), sum(p.params for p in ps),
                 sum(p.state for p in ps), sum(p.activations for p in ps))


def shard_step(shards: list[Shard], host_bandwidth: float) -> tuple[float, float]:
    """(with prefetch, without) seconds of one step: forward through the shards, backward back.

    A forward task reads its shard's parameters in and sends its saved activations out; a
    backward task reads the parameters, optimizer state and activations in and sends the
    updated parameters and state out. The last shard's forward and backward run back to back,
    so it stays on the device. With prefetch a task's compute overlaps the next task's copy in
    and the previous task's copy out (the link runs both ways at once)."""
    if len(shards) == 1:  # it fits: no copies at all
        s = shards[0]
        return s.forward + s.backward, s.forward + s.backward
    bw = host_bandwidth
    tasks = []  # (compute, bytes in, bytes out)
    for s in shards:
        tasks.append((s.forward, s.params, s.activations))
    last = shards[-1]
    for s in reversed(shards):
        if s is last:  # still on the device: only its optimizer state comes in
            tasks.append((s.backward, s.state - s.params, s.state))
        else:
            tasks.append((s.backward, s.state + s.activations, s.state))
    serial = sum(c + (i + o) / bw for c, i, o in tasks)
    step = tasks[0][1] / bw + tasks[-1][2] / bw
    for t, (compute, _, _) in enumerate(tasks):
        copy_in = tasks[t + 1][1] / bw if t + 1 < len(tasks) else 0.0
        copy_out = tasks[t - 1][2] / bw if t > 0 else 0.0
        step += max(compute, copy_in, copy_out)
    return step, serial


def model_parallel_step(graph: Graph, profiles: list[NodeProfile], cluster: Cluster, devices: int) -> float:
    """One step of plain model parallelism on ``devices``: the node sequence cut into that many
    stages of about equal memory, one stage computing at a time, the activations crossing each
    cut sent forward and their gradients back over the cluster's links (no pipelining)."""
    total = sum(p.state + p.activations for p in profiles)
    target = total / devices
    cuts, acc = [], 0.0
    for i, p in enumerate(profiles[:-1]):
        acc += p.state + p.activations
        if acc >= target * (len(cuts) + 1) and len(cuts) < devices - 1:
            cuts.append(i)
    pos = {n.name: i for i, n in enumerate(graph.nodes)}
    crossing = 0.0  # a value read past several cuts is passed on at each of them
    for node in graph.nodes:
        for op in node.inputs:
            if op.is_node:
                crossing += op.spec.nbytes * sum(pos[op.source] <= c < pos[node.name] for c in cuts)
    bw, lat = cluster.link(cluster.nodes > 1)
    compute = sum(p.forward + p.backward for p in profiles)
    return compute + 2 * (crossing / bw + len(cuts) * (lat + cluster.call_latency))
