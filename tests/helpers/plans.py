"""Plans for codegen tests, written by hand: no search, they only have to be valid.

``follow`` completes pins the way Megatron-LM does by hand: a node that reads a tensor split
along some axis splits the dim that indexes that axis the same way (if it can), so that layouts
flow along the graph without communication until a node cannot follow (a layer norm's feature
dim, a split's cut axis). The batch dim of every node goes on the data-parallel mesh axes
(``autopar.core.batch``). ``split_everything`` gives every node the config that cuts the most of
its dims, reduction dims first, so rules a searched plan rarely picks run anyway.
``two_stage_plan`` is a pipelined plan cut by hand.
"""


from __future__ import annotations

import dataclasses

from autopar.core.batch import batch_dims
from autopar.core.ir import Graph, Node
from autopar.core.space import mesh_configs
from autopar.core.tables import Config, Mesh
from autopar.planning.plan import Plan, SearchInfo, Stage

Layout = dict[int, tuple[int, ...]]  # tensor axis -> mesh axes splitting it


def config(node: Node, mesh_shape, cuts: dict[str, tuple[int, ...]]) -> Config:
    splits, axes = [], []
    for d in node.dims:
        a = tuple(sorted(cuts.get(d.name, ())))
        n = 1
        for x in a:
            n *= mesh_shape[x]
        splits.append(n)
        axes.append(a)
    return Config(tuple(splits), tuple(axes))


def data_parallel(graph: Graph, mesh_shape) -> dict[str, Config]:
    axes = tuple(range(len(mesh_shape)))
    return {name: config(graph.node(name), mesh_shape, {b: axes})
            for name, b in batch_dims(graph).items() if b is not None}


def follow(graph: Graph, mesh_shape, pins: dict[str, dict[str, tuple[int, ...]]],
           dp: tuple[int, ...] = ()) -> dict[str, Config]:
    """Pinned nodes as given; others split the dims their inputs arrive split by (+ batch on dp)."""
    batch = batch_dims(graph) if dp else {}
    layouts: dict[tuple[str, int], Layout] = {}
    plan = {}
    for node in graph.nodes:
        cuts: dict[str, tuple[int, ...]] = {}
        if batch.get(node.name):
            cuts[batch[node.name]] = dp
        if node.name in pins:
            cuts.update(pins[node.name])
        else:
            _follow_inputs(node, layouts, cuts, mesh_shape)
        cfg = config(node, mesh_shape, cuts)
        plan[node.name] = cfg
        for j, spec in enumerate(node.outputs):
            layouts[(node.name, j)] = {i: tuple(cuts[ax[0]]) for i, ax in enumerate(spec.axes)
                                       if ax and cuts.get(ax[0])}
    return plan


def _follow_inputs(node: Node, layouts, cuts: dict, mesh_shape) -> None:
    used = {a for axes in cuts.values() for a in axes}
    for op in node.inputs:
        for axis, mesh_axes in layouts.get((op.source, op.output), {}).items():
            dims = op.spec.axes[axis]
            if not dims or dims[0] in cuts or used & set(mesh_axes):
                continue
            dim = node.dim(dims[0])
            parts = 1
            for a in mesh_axes:
                parts *= mesh_shape[a]
            if dim.splittable and dim.size % parts == 0:
                cuts[dim.name] = tuple(mesh_axes)
                used |= set(mesh_axes)


def sequence_split(graph: Graph, mesh_shape, axes: tuple[int, ...], dp: tuple[int, ...] = ()) -> dict[str, Config]:
    """Context parallelism by hand: the token embedding (the first node) splits its sequence dim
    ``s`` over ``axes`` and everything follows, so attention runs its query rows split with the
    keys and values gathered whole."""
    return follow(graph, mesh_shape, {graph.nodes[0].name: {"s": axes}, **_whole_logits(graph)}, dp)


def _whole_logits(graph: Graph) -> dict[str, dict]:
    """The flattening of (batch, seq, vocab) logits to (batch * seq, vocab) before the loss, kept
    whole: the sequence split would be a minor cut of its merged axis (a strided layout);
    whole, the logits are all-gathered into it along the sequence."""
    loss = next((n for n in graph.nodes if n.op == "cross_entropy"), None)
    return {loss.inputs[0].source: {}} if loss is not None and not loss.inputs[0].source.startswith("input:") else {}


def sequence_parallel(graph: Graph, mesh_shape, tp: tuple[int, ...], dp: tuple[int, ...] = ()) -> dict[str, Config]:
    """Megatron-LM's tensor parallelism with sequence parallelism, by hand, for the zoo's gpt:
    column-parallel ``qkv``/``fc1`` (output features over ``tp``), attention by heads,
    row-parallel ``proj``/``fc2`` (input features), and the embedding, norms and residual
    stream split along the sequence over the same axes: an all-gather into each
    column-parallel linear, a reduce-scatter out of each row-parallel one."""
    pins: dict[str, dict[str, tuple[int, ...]]] = {graph.nodes[0].name: {"s": tp}, **_whole_logits(graph)}
    for node in graph.nodes:
        module = node.module or ""
        if node.op == "linear" and module.endswith(("qkv", "fc1")):
            pins[node.name] = {"n": tp}
        elif node.op == "linear" and module.endswith(("proj", "fc2")):
            pins[node.name] = {"k": tp}
        elif node.op == "sdpa":
            pins[node.name] = {"h": tp}
    return follow(graph, mesh_shape, pins, dp)


def split_everything(graph, mesh) -> dict:
    def score(node, config):
        cut = [d for d, s in zip(node.dims, config.splits) if s > 1]
        return (len(cut), sum(d.reduction for d in cut), config.devices)

    return {n.name: max(mesh_configs(n, mesh), key=lambda c, n=n: score(n, c)) for n in graph.nodes}


def split_plan(plan: Plan) -> Plan:
    """``plan`` with every node's layout replaced by ``split_everything``'s (no baselines: they
    were priced for the searched layout)."""
    return dataclasses.replace(plan, assignment=split_everything(plan.graph, plan.mesh), baselines={})


def two_stage_plan(graph, microbatches: int, schedule: str, cut: int | None = None,
                   devices: int = 1, assignment: dict | None = None) -> Plan:
    """Cut in the middle of the node list (inside GPT's second block: stage 1 starts at its qkv).

    ``assignment``: configs on the stage's sub-mesh; the plan holds them on the full mesh (the
    stage axis first), as ``autopar.plan`` writes them.
    """
    names = [n.name for n in graph.nodes]
    cut = len(names) // 2 if cut is None else cut
    mesh = Mesh((2,) if devices == 1 else (2, devices))
    full = {k: Config(c.splits, tuple(tuple(a + 1 for a in axes) for axes in c.mesh_axes))
            for k, c in (assignment or {}).items()}
    # every node has a config, as in a plan autopar writes (a file missing one is refused on load)
    full = {n.name: full.get(n.name, Config((1,) * len(n.dims), ((),) * len(n.dims))) for n in graph.nodes}
    return Plan("hand", "", {}, mesh, "analytic", "mesh", "training", full, 0.0, "s", 0.0,
                SearchInfo("by hand", 0.0),
                stages=[Stage(names[:cut], devices), Stage(names[cut:], devices)],
                microbatches=microbatches, schedule=schedule, graph=graph)
