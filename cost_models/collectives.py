"""The collectives a plan predicts, itemized: what the analytic model prices, one entry per tensor.

The design notes (why it is built this way, what was checked) are in docs/cost_model.md, "The predicted collective list".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from autopar.cost_models.analytic import FLOAT_DTYPES, AnalyticModel, check_mode
from autopar.cost_models.batchnorm_stats import bn_stats
from autopar.cost_models.causal_exchange import balance_axes, balance_steps
from autopar.cost_models.comm import Collective, collective, collective_time, group_of, reshard_steps
from autopar.cost_models.experts import exchange_axes, exchanges
from autopar.cost_models.loss_count import loss_count

from autopar.core.buckets import make_buckets
from autopar.core.cluster import Cluster
from autopar.core.ir import Graph
from autopar.core.layout import (
    Layout,
    Partial,
    Shard,
    format_layout,
    grad_of_input,
    node_layouts,
    shard_factor,
    tensor_layout,
    to_mesh,
)
from autopar.core.tables import Config
from autopar.core.weight_views import lifted_grad_axes

# the cost model's kind -> the op name CommDebugMode counts (c10d_functional, namespace stripped)
TORCH_NAMES = {"all-reduce": "all_reduce", "all-gather": "all_gather_into_tensor",
               "reduce-scatter": "reduce_scatter_tensor", "all-to-all": "all_to_all_single",
               "broadcast": "broadcast", "send/recv": "send/recv"}


@dataclass(frozen=True)
class Item:
    """One predicted collective (for a grad-sync bucket: one priced collective over ``tensors``).

    ``where``: "edge" (a reshard between two nodes), "grad-sync" (a node's weight gradients),
    "bn-stats" (a batch norm's global statistics), "experts" (a mixture of experts' token
    exchange), "attention" (a balanced causal attention's query rows,
    ``causal_exchange``), "loss-count" (a mean loss's count of counted targets) or "output" (a graph output left
    partial). ``tensors``: the tensors it moves, e.g.
    ``("layers_0:0 -> relu:0",)`` or ``("param:layers_0.weight", "param:layers_0.bias")``.
    ``nbytes`` of each tensor per device, as the formula's N (for a bucket: the sum).
    """

    phase: str  # "forward" | "backward"
    where: str
    node: str  # the consuming node (edge), the node (grad-sync, output)
    tensors: tuple[str, ...]
    collective: Collective

    @property
    def kind(self) -> str:
        return self.collective.kind

    @property
    def op(self) -> str:
        """The op name the tests' collective counter (``tests/helpers/collective_counts.py``)
        reports (c10d's in-place ops, which the gradient buckets and the fast moves call, are
        counted under these functional names)."""
        return TORCH_NAMES[self.collective.kind]

    def __str__(self) -> str:
        return (f"{self.phase:8s} {self.where:9s} {', '.join(self.tensors)}: "
                f"{self.collective.formula()}")


@dataclass(frozen=True)
class Reshard:
    """One edge's reshard in one phase whose per-axis pricing ignores the nested shard order."""

    phase: str
    tensor: str  # "src:out -> dst:in"
    src: Layout
    dst: Layout

    def __str__(self) -> str:
        return f"{self.phase} {self.tensor}: {format_layout(self.src)} -> {format_layout(self.dst)}"


@dataclass
class Collectives:
    """The predicted collectives of a plan; ``forward``/``backward`` count them per tensor."""

    items: list[Item] = field(default_factory=list)
    nested: list[Reshard] = field(default_factory=list)  # see "Nested shard order" above

    def counts(self, phase: str, backend: str = "nccl") -> Counter:
        """CommDebugMode-style counts of ``phase``; ``backend="gloo"``: all-to-all as all-gather
        (DTensor's fallback on CPU process groups)."""
        c: Counter = Counter()
        for it in self.items:
            if it.phase == phase:
                op = it.op
                if backend == "gloo" and op == "all_to_all_single" and it.where not in ("experts", "attention"):
                    op = "all_gather_into_tensor"
                c[op] += 1
        return c

    @property
    def forward(self) -> Counter:
        return self.counts("forward")

    @property
    def backward(self) -> Counter:
        return self.counts("backward")

    @property
    def seconds(self) -> float:
        """What the cost model charges for all of them."""
        return sum(it.collective.seconds for it in self.items)

    def of(self, where: str | None = None, node: str | None = None) -> list[Item]:
        return [it for it in self.items
                if (where is None or it.where == where) and (node is None or it.node == node)]

    def lines(self) -> list[str]:
        return [str(it) for it in self.items]


def predicted_collectives(graph: Graph, assignment: dict[str, Config], cluster: Cluster,
                          mode: str = "train", model: AnalyticModel | None = None) -> Collectives:
    """Every collective the analytic cost model charges ``assignment`` for, in graph order.

    A node missing from ``assignment`` is replicated (as codegen runs it).
    """
    mode = check_mode(mode)
    model = model or AnalyticModel()
    mesh = cluster.mesh()
    out = Collectives()
    nodes = {n.name for n in graph.nodes}
    lifted: dict[str, tuple[int, ...]] = {}  # weight -> axes a view's partial gradient adds to its sync

    def cfg_of(name: str) -> Config:
        node = graph.node(name)
        c = assignment.get(name) or Config((1,) * len(node.dims), ((),) * len(node.dims))
        m = to_mesh(c, mesh)
        if m is None:
            raise ValueError(f"node {name}: config {c} is not realizable on mesh {mesh.shape}")
        return m

    for n in graph.nodes:
        for i, op in enumerate(n.inputs):
            if not op.is_node:
                continue
            src = graph.node(op.source)
            spec, s_lay, d_lay, d_grad, s_grad = model._edge_layouts(
                src, op.output, n, i, [cfg_of(src.name)], [cfg_of(n.name)], mesh)
            name = f"{src.name}:{op.output} -> {n.name}:{i}"
            phases = [("forward", s_lay[0], d_lay[0])]
            if mode == "train" and spec.dtype in FLOAT_DTYPES:
                axes = lifted_grad_axes(src, s_lay[0], d_lay[0], d_grad[0])
                if axes:  # summed with the weight's gradient, in its bucket (``_grad_sync``)
                    lifted[src.params[0].source] = axes
                else:
                    phases.append(("backward", d_grad[0], s_grad[0]))
            for phase, a, b in phases:
                for step in reshard_steps(spec.nbytes, a, b, mesh, cluster):
                    out.items.append(Item(phase, "edge", n.name, (name,), step))
                if nested_order_conflict(a, b):
                    out.nested.append(Reshard(phase, name, a, b))
        out.items += _experts(n, cfg_of(n.name), mesh, cluster, mode) + _balance(n, cfg_of(n.name), mesh, cluster, mode)
        count = loss_count(n, cfg_of(n.name), mesh, cluster)
        if count is not None:  # AnalyticModel.node_breakdown's count of counted targets
            out.items.append(Item("forward", "loss-count", n.name, (f"{n.name}:count",), count))
        if mode == "train":
            stats = bn_stats(n, cfg_of(n.name), mesh, cluster)
            if stats is not None:  # AnalyticModel.node_breakdown's "batch-norm statistics"
                for stat in ("mean", "var"):
                    out.items.append(Item("forward", "bn-stats", n.name, (f"{n.name}:{stat}",),
                                          stats))
    if mode == "train":
        out.items += _grad_sync(graph, cfg_of, mesh, cluster, lifted)
    for name, idx in graph.outputs:
        if name not in nodes:
            continue
        node = graph.node(name)
        spec = node.outputs[idx]
        lay = tensor_layout(node, cfg_of(name), spec, mesh, output=True)
        axes = [a for a, x in enumerate(lay) if isinstance(x, Partial)]
        if axes:
            c = collective("all-reduce", spec.nbytes / shard_factor(lay, mesh), axes, mesh, cluster)
            if c.p > 1:
                out.items.append(Item("forward", "output", name, (f"{name}:{idx}",), c))
    return out


def _experts(node, cfg: Config, mesh, cluster: Cluster, mode: str) -> list[Item]:
    """A ``moe_experts`` node's own all-to-alls (``experts.exchanges``), priced as it prices them
    (c10d's all_to_all_single on every backend, not DTensor's all-gather fallback)."""
    steps = exchanges(node, cfg, mesh, mode)
    if not steps:
        return []
    return _all_to_all_items(steps, "experts", node, exchange_axes(node, cfg, mesh), mesh, cluster)


def _balance(node, cfg: Config, mesh, cluster: Cluster, mode: str) -> list[Item]:
    """A balanced causal attention's all-to-alls (``causal_exchange.balance_steps``), as priced."""
    steps = balance_steps(node, cfg, mode)
    if not steps:
        return []
    return _all_to_all_items(steps, "attention", node, balance_axes(node, cfg), mesh, cluster)


def _all_to_all_items(steps, role: str, node, axes, mesh, cluster: Cluster) -> list[Item]:
    """One ``Item`` per all-to-all of ``steps`` (``(phase, what, bytes per device)`` each) over
    the group of mesh ``axes``, priced on the cluster's all-to-all links."""
    p, cross = group_of(axes, mesh)
    bw, lat = cluster.kind_link("all-to-all", *cluster.link(cross))
    return [Item(phase, role, node.name, (f"{node.name}:{what}",),
                 Collective("all-to-all", axes, p, float(n), bw, lat, cross,
                            collective_time("all-to-all", n, p, bw, lat, cluster.call_latency), "", 0.0,
                            cluster.call_latency))
            for phase, what, n in steps]


def _grad_sync(graph: Graph, cfg_of, mesh, cluster: Cluster, lifted: dict[str, tuple[int, ...]]) -> list[Item]:
    """The reducer's buckets (``core.buckets``): each parameter once, as its first reader reads
    it (how it is stored), reduced over the mesh axes where that reader's gradient is partial
    (for the weight of a view whose reader's partial gradient is passed on: ``lifted``'s axes);
    a training batch norm with its batch split reduces its own parameters, one by one."""
    params: list[tuple[str, tuple[int, ...], float]] = []
    own: list[Item] = []
    seen: set[str] = set()
    for node in graph.nodes:
        cfg = cfg_of(node.name)
        lay = node_layouts(node, cfg, mesh)
        synced_bn = bn_stats(node, cfg, mesh, cluster) is not None
        for op, pl in zip(node.params, lay.params):
            if op.source in seen:
                continue
            seen.add(op.source)
            if op.spec.dtype not in FLOAT_DTYPES:
                continue
            g = grad_of_input(pl, node, cfg, mesh)
            axes = tuple(a for a, x in enumerate(g) if isinstance(x, Partial)) or lifted.get(op.source, ())
            nbytes = op.spec.nbytes / shard_factor(pl, mesh)
            if synced_bn and axes:
                c = collective("all-reduce", nbytes, axes, mesh, cluster)
                own.append(Item("backward", "bn-params", node.name, (op.source,), c))
            else:
                params.append((op.source, axes, nbytes))
    items = []
    for k, b in enumerate(make_buckets(params)):
        c = collective("all-reduce", b.nbytes, b.axes, mesh, cluster)
        if c.p > 1:
            items.append(Item("backward", "grad-sync", f"bucket {k}", tuple(b.names), c))
    return items + own


def _dims(pl) -> set:
    return {pl.axis} if isinstance(pl, Shard) else set()


def nested_order_conflict(src: Layout, dst: Layout) -> bool:
    """Does some mesh axis change its placement of a tensor axis that a higher mesh axis also
    shards (in ``src`` or ``dst``) and does not change the same way? Then per-axis steps may not
    be what DTensor can run (see "Nested shard order" above): a superset of the reshards that
    ``comm.reshard_steps`` prices by DTensor's sequence. ``x -> Partial`` is free.
    """
    for a, (s, d) in enumerate(zip(src, dst)):
        if s == d or isinstance(d, Partial):
            continue
        moved = _dims(s) | _dims(d)
        for b in range(a + 1, len(src)):
            # axes that change the same way run as one collective over the flattened group
            if moved & (_dims(src[b]) | _dims(dst[b])) and (src[b], dst[b]) != (s, d):
                return True
    return False
