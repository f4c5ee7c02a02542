"""Routed experts as the hierarchical search sees them: which nodes they are, and per unit what
their parameters hold and how many bytes their tokens' dispatch moves.

Routed experts are the nodes of an op family ``moe_experts``, or nodes whose parameters live
under a module named ``experts`` (Hugging Face's Mixtral, Qwen2-MoE and DeepSeek, and the zoo's
MoE, name them so; a shared expert is named otherwise and stays dense). Their FLOPs are the
graph's: the zoo's MoE runs its experts on the routed tokens' buffers, so its expert nodes count
``tokens x top_k`` rows, not every expert on every token.

The expert degree's price (``step_price.price``) needs, per unit of the tensor group's solved
plan (``units.UnitStats``):

* the experts' parameter, gradient and optimizer bytes and parameter elements per device under
  the group's layout, the part expert parallelism divides by its degree;
* ``dispatch``: bytes per device per microbatch of the tokens entering the experts (the tensors
  the experts' module reads from outside it: ``tokens x top_k x hidden`` in the compute dtype),
  1/t of the microbatch's per tensor-group device (the group's devices split the tokens for the
  exchange, as Megatron-Core's dispatcher does under sequence parallelism); ``layers``: how many
  MoE layers the unit holds (one dispatch and one combine each).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from autopar.core.ir import Graph, Node
from autopar.core.layout import node_layouts, shard_factor, to_mesh
from autopar.cost_models.analytic import FLOAT_DTYPES
from autopar.cost_models.memory import node_memory
from autopar.planning.units import UnitStats

_EXPERTS = re.compile(r"^(.*?(?:^|\.)experts)(?:\.|$)")  # the module path up to its `experts` component


def experts_module(path: str) -> str | None:
    """``layers.3.mlp.experts.w1`` -> ``layers.3.mlp.experts``; None outside an experts module."""
    m = _EXPERTS.match(path.removeprefix("param:"))
    return m.group(1) if m else None


def is_routed(node: Node) -> bool:
    return node.op == "moe_experts" or (bool(node.params) and all(experts_module(p.source) for p in node.params))


def expert_count(graph: Graph) -> int:
    """Routed experts per MoE layer (0: none): the leading axis of stacked expert weights, else
    the number of numbered expert modules of the first layer."""
    numbered: dict[str, set[str]] = {}
    for n in graph.nodes:
        if not is_routed(n):
            continue
        if "experts" in n.attrs:
            return int(n.attrs["experts"])
        for p in n.params:
            if p.spec.dtype in FLOAT_DTYPES and len(p.spec.shape) == 3:
                return int(p.spec.shape[0])
            mod = experts_module(p.source)
            rest = p.source.removeprefix("param:")[len(mod) + 1:].split(".")[0]
            if rest.isdigit():
                numbered.setdefault(mod, set()).add(rest)
    return min((len(v) for v in numbered.values()), default=0)


@dataclass
class ExpertStats:
    """Per unit of the full graph (as ``UnitStats``): the routed experts' share."""

    params: np.ndarray  # bytes per device, as UnitStats.params counts them
    grads: np.ndarray
    optimizer: np.ndarray
    numel: np.ndarray
    dispatch: np.ndarray  # bytes per device per microbatch entering the experts (all layers of the unit)
    layers: np.ndarray  # MoE layers in the unit
    experts: int  # routed experts per layer


def expert_stats(s: UnitStats, mode: str, optimizer: str | None) -> ExpertStats | None:
    """The routed experts' part of ``s``; None when the graph has none."""
    g = s.graph
    experts = expert_count(g)
    if not experts:
        return None
    mesh = s.cluster.mesh()
    t = s.cluster.devices
    names = {n.name: n for n in g.nodes}
    per_node: dict[int, tuple[float, float, float, float, str]] = {}
    for i, node in enumerate(g.nodes):
        if not is_routed(node):
            continue
        cfg = s.tables.configs[i][s.choice[i]]
        mb = node_memory(node, cfg, mesh, mode, optimizer)
        lay = node_layouts(node, to_mesh(cfg, mesh), mesh)
        numel = sum(op.spec.numel / shard_factor(pl, mesh) for op, pl in zip(node.params, lay.params)
                    if op.spec.dtype in FLOAT_DTYPES)
        mod = experts_module(node.params[0].source) if node.params else node.module
        per_node[i] = (mb.params, mb.grads, mb.optimizer, numel, mod)
    U = len(s.spans)
    out = {k: np.zeros(U) for k in ("params", "grads", "optimizer", "numel", "dispatch", "layers")}
    node_map = s.node_map if s.node_map is not None else range(len(g.nodes))
    for u, (a, b) in enumerate(s.spans):
        seen: set[tuple[str, int]] = set()
        mods: set[str] = set()
        for i in (node_map[j] for j in range(a, b)):
            if i not in per_node:
                continue
            params, grads, opt, numel, mod = per_node[i]
            out["params"][u] += params
            out["grads"][u] += grads
            out["optimizer"][u] += opt
            out["numel"][u] += numel
            mods.add(mod)
            for op in g.nodes[i].inputs:
                src = names.get(op.source)
                inside = src is not None and (is_routed(src) or (src.module + ".").startswith(mod + "."))
                if op.is_node and not inside and (op.source, op.output) not in seen:
                    seen.add((op.source, op.output))
                    out["dispatch"][u] += op.spec.nbytes / t
        out["layers"][u] = len(mods)
    return ExpertStats(out["params"], out["grads"], out["optimizer"], out["numel"], out["dispatch"],
                       out["layers"], experts)


def expert_totals(graph: Graph) -> tuple[float, float]:
    """(bytes, elements) of the routed experts' floating-point parameters, each once."""
    seen: dict[str, tuple[int, int]] = {}
    for n in graph.nodes:
        if is_routed(n):
            for p in n.params:
                if p.spec.dtype in FLOAT_DTYPES:
                    seen[p.source] = (p.spec.nbytes, p.spec.numel)
    return float(sum(b for b, _ in seen.values())), float(sum(k for _, k in seen.values()))
