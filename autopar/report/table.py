"""``plan.report()``: what autopar chose, why, what it costs, and what it gains over hand plans.

One row per node, grouped by module path; a run of identical repeated blocks ("blocks.0" ...
"blocks.47" with the same configs and costs) prints once with "blocks.1-47: same as blocks.0".
Costs per node are read back from the cost tables the search used (node cost + the resharding of
its inputs), so the rows add up to the plan's total; compute is the node cost less the analytic
sync and output terms, which the analytic and profiled models share (``node_numbers``).

A pipelined plan is reported per stage (``pipeline_numbers``): its devices, per-microbatch time,
gradient sync, memory with the schedule's in-flight microbatches, the step formula and the bubble,
then its nodes re-priced on the stage's devices at microbatch size, as the planner priced them.
A PaSE plan is reported over PaSE's nodes (``pase_numbers``), with PaSE's dim names and its
FLOP-equivalent units (compute = the layer cost at r = 0, comm = the rest plus incoming edges).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from autopar.core.graph_table import human

_BLOCK = re.compile(r"^(?P<prefix>.*?)\.(?P<idx>\d+)(?:\.(?P<rest>.*))?$")


def split_words(node, config) -> str:
    """'b/4, n/2' from a config; 'replicated' when nothing is split."""
    words = [f"{d.name}/{s}" for d, s in zip(node.dims, config.splits) if s > 1]
    return ", ".join(words) if words else "replicated"


def fmt_seconds(s: float) -> str:
    if s == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s:.3g} s"


def fmt_bytes(b: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(b) >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


NODE_HEADER = ["module", "op", "split", "param placements", "output placements", "compute", "comm", "memory"]


@dataclass
class Row:
    module: str
    block: tuple[str, int] | None  # (prefix, index) of a repeated block, else None
    cells: list[str]


@dataclass
class NodeNumbers:
    """One node's share of the plan, as numbers (the report's rows are these, formatted).

    ``compute + comm`` is the node's table cost plus the resharding of its inputs (edges into it);
    ``comm`` also holds its weight-gradient sync and any graph-output reduction, except in a
    pipelined plan, where the sync is paid once per step and is kept apart in ``sync``.
    """

    name: str
    compute: float
    comm: float
    memory: float
    sync: float = 0.0


def _incoming(tables, choice) -> np.ndarray:
    incoming = np.zeros(len(tables.nodes))
    for (u, v), m in tables.edge_cost.items():
        incoming[v] += float(m[choice[u], choice[v]])
    return incoming


def _choice(tables, assignment) -> list[int]:
    return [tables.configs[i].index(assignment[name]) for i, name in enumerate(tables.nodes)]


class _CommTerms:
    """Per node: what the analytic model charges for anything but compute (weight-gradient sync,
    graph-output reduction). Both mesh cost models share these terms (the profiled model measures
    only compute), so a node's compute is its table cost minus them, whichever model priced it.
    """

    def __init__(self, model, graph, cluster, mode):
        self.model, self.cluster, self.mode = model, cluster, mode
        self.outputs: dict[str, list[int]] = {}
        for name, idx in graph.outputs:
            self.outputs.setdefault(name, []).append(idx)

    def of(self, node, cfg) -> tuple[float, float]:
        """(weight-gradient sync, graph-output reduction) of ``node`` under ``cfg``."""
        nc = self.model.node_breakdown(node, cfg, self.cluster, self.mode, text=False)
        sync = sum(t.seconds for t in nc.terms if "compute" not in t.label)
        out = sum(float(self.model.output_cost(node, k, [cfg], self.cluster, self.mode)[0])
                  for k in self.outputs.get(node.name, []))
        return sync, out


def node_numbers(plan) -> list[NodeNumbers]:
    """Compute, communication and memory of every node of a single-stage mesh plan (analytic or
    profiled), read back from the plan's cost tables so that they add up to ``plan.cost``."""
    from autopar.core.cluster import Cluster

    tables, graph = plan.tables, plan.graph
    choice = _choice(tables, plan.assignment)
    incoming = _incoming(tables, choice)
    from autopar.cost_models.analytic import AnalyticModel

    terms = _CommTerms(AnalyticModel(), graph, Cluster(**plan.cluster), plan.mode)
    index = {name: i for i, name in enumerate(tables.nodes)}
    out = []
    for node in graph.nodes:
        i = index[node.name]
        cost = float(tables.node_cost[i][choice[i]])
        sync, red = terms.of(node, plan.assignment[node.name])
        compute = cost - sync - red if np.isfinite(cost) else cost
        mem = float(tables.memory[i][choice[i]]) if tables.memory else 0.0
        out.append(NodeNumbers(node.name, compute, sync + red + float(incoming[i]), mem))
    return out


def _rows(graph, numbers: list[NodeNumbers], assignment, mesh, fmt=None) -> list[Row]:
    from autopar.core.layout import format_layout, node_layouts, to_mesh

    fmt = fmt or fmt_seconds
    by_name = {n.name: n for n in numbers}
    rows = []
    for node in graph.nodes:
        if node.name not in by_name:
            continue
        nums = by_name[node.name]
        cfg = assignment[node.name]
        mcfg = to_mesh(cfg, mesh)
        params = outs = "-"
        if mcfg is not None:
            lay = node_layouts(node, mcfg, mesh)
            params = " ".join(format_layout(p) for p in lay.params) or "-"
            outs = " ".join(format_layout(o) for o in lay.outputs) or "-"
        m = _BLOCK.match(node.module or "")
        block = (m["prefix"], int(m["idx"])) if m else None
        label = node.module or node.name
        op = node.op + ("*" if node.unsupported else "")
        rows.append(Row(label, block, [label, op, split_words(node, cfg), params, outs, fmt(nums.compute),
                                       fmt(nums.comm), fmt_bytes(nums.memory)]))
    return rows


def _node_rows(plan) -> list[Row]:
    return _rows(plan.graph, node_numbers(plan), plan.assignment, plan.mesh)


def _fold(rows: list[Row]) -> list[list[str]]:
    """Rows with runs of identical repeated blocks folded into one line."""
    out: list[list[str]] = []
    i = 0
    while i < len(rows):
        r = rows[i]
        if r.block is None:
            out.append(r.cells)
            i += 1
            continue
        prefix, first = r.block
        j = i
        while j < len(rows) and rows[j].block == (prefix, first):
            j += 1
        body = rows[i:j]
        key = [_unindexed(x) for x in body]
        k, last = j, first
        while True:
            nxt = k + len(body)
            cand = rows[k:nxt]
            if len(cand) == len(body) and all(c.block == (prefix, last + 1) for c in cand) \
                    and [_unindexed(x) for x in cand] == key:
                k, last = nxt, last + 1
            else:
                break
        out.extend(x.cells for x in body)
        if last > first:
            span = f"{first + 1}" if last == first + 1 else f"{first + 1}-{last}"
            out.append([f"{prefix}.{span}: same as {prefix}.{first}", "", "", "", "", "", "", ""])
        i = k
    return out


def _unindexed(row: Row) -> list[str]:
    m = _BLOCK.match(row.module)
    rest = m["rest"] if m else row.module
    return [rest or ""] + row.cells[1:]


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(r[c]) for r in [header] + [r for r in rows if r[1] or c == 0])
              for c in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    for r in rows:
        if not r[1]:  # a fold line spans the table
            lines.append("  " + r[0])
        else:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return lines


# -- pipelined plans ---------------------------------------------------------------------------


@dataclass
class StageNumbers:
    """One pipeline stage as the planner priced it (recomputed from the plan and its graph)."""

    index: int
    first: int  # position of its first node in execution order
    last: int  # position of its last node (inclusive)
    devices: tuple[int, int]  # global ranks [start, end)
    time: float  # per microbatch: its nodes' forward+backward + sending/receiving at its cuts
    compute: float  # per microbatch, summed over its nodes
    comm: float  # per microbatch: resharding inside the stage (and graph-output reductions)
    send_recv: float  # per microbatch: activations and their gradients across its cuts
    sync: float  # once per step: weight-gradient all-reduce inside the stage
    memory: float | None  # peak bytes per device (static + in-flight activations); None if unknown
    in_flight: int  # microbatches whose activations it holds at its peak
    nodes: list[NodeNumbers]


@dataclass
class PipelineNumbers:
    stages: list[StageNumbers]
    microbatches: int
    schedule: str
    stage_devices: int
    stage_mesh: object  # the Mesh of one stage's devices
    assignment: dict  # node -> config on the stage mesh
    graph: object  # the graph at microbatch size
    consistent: bool  # recomputed stage times equal the plan's

    @property
    def slots(self) -> int:
        return self.microbatches + len(self.stages) - 1

    @property
    def bottleneck(self) -> float:
        return max(s.time for s in self.stages)

    @property
    def step(self) -> float:
        """``(M + S - 1) * slowest stage + slowest sync``: search.pipeline's step time."""
        return self.slots * self.bottleneck + max(s.sync for s in self.stages)

    @property
    def bubble(self) -> float:
        """The fill-and-drain share of the pipelined part: (S - 1) / (M + S - 1)."""
        return (len(self.stages) - 1) / self.slots

    @property
    def idle(self) -> float:
        """Device time idle in the pipelined part, counting slots a faster stage waits out too."""
        busy = sum(self.microbatches * s.time for s in self.stages)
        return 1.0 - busy / (len(self.stages) * self.slots * self.bottleneck)


def pipeline_numbers(plan) -> PipelineNumbers | None:
    """Re-price a pipelined plan's stages the way ``pipeline_plan.price_options`` did: the graph at
    microbatch size on one stage's devices under the analytic model. None when the plan has no
    stages or no ir graph (a plan loaded from a file carries neither graph nor tables)."""
    from autopar.core.batch import scale_batch
    from autopar.core.cluster import Cluster
    from autopar.cost_models.analytic import AnalyticModel
    from autopar.cost_models.memory import node_memory
    from autopar.cost_models.tables import build_tables
    from autopar.core.ir import Graph
    from autopar.planning.stages import cut_times, stage_counts
    from autopar.search.pipeline import in_flight
    from autopar.core.tables import Config

    if not plan.stages or not isinstance(plan.graph, Graph):
        return None
    cluster = Cluster(**plan.cluster)
    n_stages, per = len(plan.stages), plan.stages[0].devices
    axes = next((a for s, a in stage_counts(cluster) if s == n_stages), None)
    if axes is None:
        return None
    sub = cluster.with_devices(per)
    mesh = sub.mesh()
    g = scale_batch(plan.graph, plan.microbatches)
    local = {name: Config(c.splits, tuple(tuple(a - axes for a in ax) for ax in c.mesh_axes))
             for name, c in plan.assignment.items()}
    model = AnalyticModel()
    t = build_tables(g, sub, model, space="mesh", mode=plan.mode)
    try:
        choice = _choice(t, local)
    except ValueError:
        return None
    incoming = _incoming(t, choice)
    terms = _CommTerms(model, g, sub, plan.mode)
    nodes = []
    statics, acts = [], []
    for i, node in enumerate(g.nodes):
        cost = float(t.node_cost[i][choice[i]])
        sync, red = terms.of(node, local[node.name])
        mb = node_memory(node, local[node.name], mesh, plan.mode)
        statics.append(mb.params + mb.grads + mb.optimizer)
        acts.append(mb.activations)
        nodes.append(NodeNumbers(node.name, cost - sync - red, red + float(incoming[i]), 0.0, sync))
    cut = np.concatenate([[0.0], cut_times(g, sub, cluster, n_stages), [0.0]])
    stages, pos = [], 0
    consistent = True
    for k, st in enumerate(plan.stages):
        a, b = pos, pos + len(st.nodes)
        pos = b
        held = in_flight(plan.schedule, k, n_stages, plan.microbatches)
        for j in range(a, b):
            nodes[j].memory = statics[j] + held * acts[j]
        mine = nodes[a:b]
        compute = math.fsum(x.compute for x in mine)
        comm = math.fsum(x.comm for x in mine)
        time = compute + comm + cut[a] + cut[b]
        consistent &= math.isclose(time, st.cost, rel_tol=1e-6, abs_tol=1e-15)
        stages.append(StageNumbers(k, a, b - 1, (k * per, (k + 1) * per), time, compute, comm,
                                   float(cut[a] + cut[b]), math.fsum(x.sync for x in mine),
                                   math.fsum(x.memory for x in mine), held, mine))
    recorded = [st.memory for st in plan.stages]
    if all(m is not None for m in recorded):  # the planner's own figures (its optimizer) win
        for s, m in zip(stages, recorded):
            s.memory = m
    peak = max(s.memory for s in stages)
    if not math.isclose(peak, plan.memory_per_device, rel_tol=1e-6):
        for s in stages:  # priced with another optimizer than the planner's: do not guess
            s.memory = None
            for x in s.nodes:
                x.memory = float("nan")
    return PipelineNumbers(stages, plan.microbatches, plan.schedule, per, mesh, local, g, consistent)


def _pipeline_lines(plan, units) -> list[str]:
    pn = pipeline_numbers(plan)
    s_count, m = len(plan.stages), plan.microbatches
    batch = _batch_size(plan.graph)
    lines = [f"pipeline: {s_count} stages x {plan.stages[0].devices} devices, {m} microbatches"
             + (f" of {batch // m} (batch {batch})" if batch and batch % m == 0 else "")
             + f", schedule {plan.schedule}"]
    if pn is None:  # no graph to re-price: what the plan file holds
        slots = m + s_count - 1
        lines.append(f"  step = (M + S - 1) x slowest stage + slowest grad sync; M + S - 1 = {slots};"
                     f" bubble (S - 1)/(M + S - 1) = {(s_count - 1) / slots:.1%}")
        for k, st in enumerate(plan.stages):
            lines.append(f"  stage {k}: {st.nodes[0]} .. {st.nodes[-1]} ({len(st.nodes)} nodes), "
                         f"devices {k * st.devices}-{(k + 1) * st.devices - 1}, "
                         f"{units(st.cost)} per microbatch, grad sync {units(st.sync)} per step"
                         + (f", {fmt_bytes(st.memory)}/device" if st.memory is not None else ""))
        return lines
    slow = max(pn.stages, key=lambda s: s.time)
    sync = max(pn.stages, key=lambda s: s.sync)
    lines.append(f"  step = (M + S - 1) x slowest stage + slowest grad sync = ({m} + {s_count} - 1) x "
                 f"{units(slow.time)} (stage {slow.index}) + {units(sync.sync)} (stage {sync.index}) = "
                 f"{units(pn.step)}")
    lines.append(f"  bubble (fill and drain): (S - 1)/(M + S - 1) = {s_count - 1}/{pn.slots} = "
                 f"{pn.bubble:.1%} "
                 f"of the pipelined time; idle with stage imbalance: {pn.idle:.1%}")
    if not pn.consistent:
        lines.append("  note: re-priced stage times differ from the plan's "
                     "(made by another autopar version?)")
    header = ["stage", "nodes", "first .. last", "devices", "per microbatch", "compute", "comm", "send/recv",
              "grad sync/step", "memory/device", "holds"]
    rows = []
    for s in pn.stages:
        first, last = plan.stages[s.index].nodes[0], plan.stages[s.index].nodes[-1]
        rows.append([str(s.index), f"{s.first}-{s.last}", f"{first} .. {last}",
                     f"{s.devices[0]}-{s.devices[1] - 1}", units(s.time), units(s.compute), units(s.comm),
                     units(s.send_recv), units(s.sync), fmt_bytes(s.memory) if s.memory is not None else "?",
                     f"{s.in_flight} mb"])
    lines += ["  " + x for x in _table(rows, header)]
    if pn.stages[0].memory is None:
        lines.append("  memory per stage unknown (the plan was priced with another optimizer)")
    lines.append("")
    lines.append(f"per stage, its nodes on the stage's {pn.stage_devices} devices "
                 f"(mesh {pn.stage_mesh.shape}),"
                 f" per microbatch (1 of {m}):")
    for s in pn.stages:
        lines.append("")
        lines.append(f"stage {s.index}: nodes {s.first}-{s.last}, devices {s.devices[0]}-{s.devices[1] - 1}; "
                     f"{units(s.time)} per microbatch = compute {units(s.compute)} + comm {units(s.comm)}"
                     f" + send/recv {units(s.send_recv)}; grad sync {units(s.sync)} once per step")
        header = NODE_HEADER
        graph_rows = _rows(pn.graph, s.nodes, pn.assignment, pn.stage_mesh, units)
        lines += _table(_fold(graph_rows), header)
    lines.append("placements per axis of the stage's mesh: S(i) shard tensor axis i, R replicate, "
                 "P partial sum; comm includes resharding the node's inputs; memory holds the stage's "
                 "in-flight microbatches")
    return lines


def _batch_size(graph) -> int | None:
    for spec in getattr(graph, "inputs", {}).values():
        if spec.shape:
            return spec.shape[0]
    return None


# -- PaSE's plans ------------------------------------------------------------------------------

PASE_UNITS = "pase-flop"

_PASE_DIMS = {
    "Conv": ("b", "c_in", "h", "w", "r", "s", "n"),
    "Pool": ("b", "c", "h", "w"),
    "LSTM": ("layers", "seq", "b", "n", "k"),
}
_PASE_REDUCTIONS = {"Conv": {"c_in", "r", "s"}, "FC": {"k"}, "LSTM": {"k"}}


def pase_dim_names(node) -> tuple[str, ...]:
    """Names of a PaSE node's iteration-space dims (its D, in PaSE's order; pase.md section 4)."""
    if node.op in _PASE_DIMS:
        return _PASE_DIMS[node.op]
    if node.op in ("Einsum", "Embedding"):
        return tuple(node.attrs["letters"])
    if node.op == "FC":
        lead = len(node.domain) - 2
        return tuple("b" if i == node.batch_axis else f"x{i}" for i in range(lead)) + ("n", "k")
    return tuple("b" if i == node.batch_axis else f"d{i}" for i in range(len(node.domain)))


def pase_reduction_dims(node) -> set[str]:
    if node.op in _PASE_REDUCTIONS:
        return _PASE_REDUCTIONS[node.op]
    if node.op in ("Einsum", "Embedding"):
        lhs, out = node.attrs["eq"].split("->")
        return {ch for ch in node.attrs["letters"] if ch not in out}
    return set()


def pase_split_words(node, config) -> str:
    words = [f"{d}/{s}" for d, s in zip(pase_dim_names(node), config.splits) if s > 1]
    return ", ".join(words) if words else "replicated"


def pase_numbers(plan) -> list[NodeNumbers]:
    """Per PaSE node: its layer cost without communication (``r = 0``: FLOPs), the rest of its
    layer cost plus the edges into it (words moved x r), in PaSE's FLOP-equivalent units."""
    from autopar.pase.ops import layer_cost

    t = plan.tables
    choice = _choice(t, plan.assignment)
    incoming = _incoming(t, choice)
    out = []
    for i, node in enumerate(plan.graph.nodes):
        cost = float(t.node_cost[i][choice[i]])
        row = np.array([plan.assignment[t.nodes[i]].splits], dtype=np.float64)
        flops = float(layer_cost(node, row, 0.0)[0])
        out.append(NodeNumbers(t.nodes[i], flops, cost - flops + float(incoming[i]), float("nan")))
    return out


def pase_rate(plan) -> float | None:
    """The word-to-FLOP rate ``r`` the plan's tables were made with (None if no node moves words)."""
    from autopar.pase.ops import layer_cost

    t = plan.tables
    for i, node in enumerate(plan.graph.nodes):
        for c in t.configs[i]:
            row = np.array([c.splits], dtype=np.float64)
            f0, f1 = float(layer_cost(node, row, 0.0)[0]), float(layer_cost(node, row, 1.0)[0])
            if f1 - f0 > 0:
                return (float(t.node_cost[i][t.configs[i].index(c)]) - f0) / (f1 - f0)
    return None


def fmt_pase(v: float) -> str:
    if v == 0:
        return "0"
    return f"{v:.4g}"


def _pase_lines(plan) -> list[str]:
    numbers = pase_numbers(plan)
    u = PASE_UNITS
    header = ["node", "from (traced nodes)", "iteration space", "split", f"compute ({u})", f"comm ({u})",
              f"total ({u})"]
    rows = []
    for node, nums in zip(plan.graph.nodes, numbers):
        src = "+".join(node.sources) if node.sources else "-"
        if len(src) > 40:
            src = src[:37] + "..."
        space = " ".join(f"{d}={n}" for d, n in zip(pase_dim_names(node), node.domain))
        rows.append([nums.name, src, space, pase_split_words(node, plan.assignment[nums.name]),
                     fmt_pase(nums.compute), fmt_pase(nums.comm), fmt_pase(nums.compute + nums.comm)])
    lines = _table(rows, header)
    lines.append(f"costs in PaSE's FLOP-equivalent units ({u}), not seconds: compute is the layer's "
                 "arithmetic (PaSE's count, forward and backward), comm is r x the 8-byte words it moves "
                 "(all-reduces, halos) plus the edges into it; dims as in PaSE: b batch, c_in/k reduced "
                 "inputs, n outputs, r/s kernel, h/w spatial, d<i> other tensor axes")
    dropped = getattr(plan.graph, "dropped", [])
    if dropped:
        lines.append(f"folded away by PaSE's view (cost 0): {len(dropped)} traced node(s)")
    return lines


def _fmt_units(plan):
    return fmt_seconds if plan.units == "s" else (lambda v: f"{v:.6g} {plan.units}")


def format_report(plan, explain: bool = False) -> str:
    from autopar.core.ir import Graph

    c = plan.cluster
    units = _fmt_units(plan)
    pase = plan.cost_model == "pase"
    lines = [
        f"autopar plan for {plan.model_name} on {c.get('name', '?')}: {plan.devices} devices, "
        f"mesh {plan.mesh.shape}"
        f" (levels {plan.mesh.level}); cost model {plan.cost_model}, space {plan.space}, mode {plan.mode}",
        f"search: {plan.search.name} in {plan.search.seconds:.3g} s, "
        + plan.search.describe(),
    ]
    if pase:
        r = pase_rate(plan) if plan.tables is not None and plan.graph is not None else None
        lines.append(f"predicted cost: {units(plan.cost)} "
                     "(PaSE's FLOP-equivalent units: FLOPs plus r x words moved"
                     + (f", r = {r:.6g} FLOP per 8-byte word" if r else "")
                     + "); memory is not modelled by PaSE's cost model")
    else:
        lines.append(f"predicted step time: {units(plan.cost)}; "
                     f"memory per device: {fmt_bytes(plan.memory_per_device)}"
                     + (f" of {fmt_bytes(c['memory_capacity'])}" if c.get("memory_capacity") else ""))
    for name, b in plan.baselines.items():
        lines.append(f"  vs {name.replace('_', ' ')}: {units(b.cost)}"
                     + ("" if pase else f", {fmt_bytes(b.memory_per_device)}/device")
                     + f" -> autopar is {b.cost / plan.cost:.3g}x faster")
    if plan.stages:
        lines += _pipeline_lines(plan, units)
    lines.append("")
    graph_ok = isinstance(plan.graph, Graph)
    if plan.stages:
        if not graph_ok:
            lines += _generic_rows(plan)
    elif pase and plan.tables is not None and plan.graph is not None and hasattr(plan.graph, "dropped"):
        lines += _pase_lines(plan)
    elif not graph_ok or not plan.tables or plan.tables.nodes != [n.name for n in plan.graph.nodes]:
        lines += _generic_rows(plan)
    else:
        lines += _table(_fold(_node_rows(plan)), NODE_HEADER)
        lines.append("placements per mesh axis: S(i) shard tensor axis i, R replicate, P partial sum;"
                     " comm includes resharding the node's inputs"
                     + ("; compute measured on this machine" if plan.cost_model == "profiled" else ""))
    if plan.unsupported:
        lines.append("")
        lines.append(f"replicated (* above; no split rule): {len(plan.unsupported)} node(s)")
        for n, why in plan.unsupported.items():
            lines.append(f"  {n}: {why}")
    if explain and plan.cost_model == "analytic" and graph_ok and not plan.stages:
        from autopar.core.cluster import Cluster
        from autopar.cost_models.analytic import explain_plan

        lines.append("")
        lines.append("the arithmetic (every term of the predicted step time):")
        lines += explain_plan(plan.graph, plan.assignment, Cluster(**plan.cluster), mode=plan.mode)
    return "\n".join(lines)


def _generic_rows(plan) -> list[str]:
    """For plans without their graph (loaded from a file): node, config, node cost if known."""
    t = plan.tables
    rows = []
    for i, name in enumerate(t.nodes if t else plan.assignment):
        cfg = plan.assignment[name]
        cost = ""
        if t is not None:
            cost = f"{float(t.node_cost[i][t.configs[i].index(cfg)]):.6g}"
        rows.append([str(name), str(cfg.splits), cost])
    widths = [max(len(r[k]) for r in rows + [["node", "config", "node cost"]]) for k in range(3)]
    out = ["  ".join(h.ljust(w) for h, w in zip(["node", "config", "node cost"], widths)).rstrip()]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return out
