"""PaSE's cost model (docs/pase.md §1-5, §8, §9) as ``CostTables`` in FLOP-equivalent units.

The objective is F(G, phi) = sum of layer costs L_v(phi_v) + sum over the (collapsed) edges of
EDGE_uv(phi_u, phi_v). Everything here is a pure function of a ``PaseGraph`` and explicit
parameters: the word-to-FLOP rate ``r``, the cutoff ``kappa`` and the device count ``p`` (PaSE keeps
all three as global state; autopar does not).

Entry points: ``rate(F, B)``, ``configurations(node, p, kappa)``, ``PaseModel(r)`` (the costs, as an
``autopar.core.cost_model.CostModel``), ``pase_tables(graph, p, kappa)``,
``evaluate(graph, strategy)``, ``data_parallel(graph, p, kappa)`` and ``tables_for(ir_graph, p,
profile)`` (view + tables). PaSE graphs come from ``pase_view`` (traced models) or
``pase_reference`` (PaSE's four graphs built by hand from the spec).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from autopar.core.cost_model import NodeCost, Term
from autopar.core.tables import Config, CostTables

from autopar.pase.graph import PaseBuilder, PaseGraph, PaseNode, PaseTensor  # noqa: F401 (re-export)
from autopar.pase.ops import edge_cost, layer_cost, tensor_config

DEFAULT_R = 5000.0  # r at PaSE's defaults: 10 TFLOP/s, 16 GB/s


def rate(tflops: float = 10.0, gbps: float = 16.0) -> float:
    """r = (1000 F) / (B / 8): FLOP per 8-byte word (§1); 5000 at PaSE's defaults."""
    return 1000.0 * tflops / (gbps / 8.0)


def allowed_splits(extent: int, p: int, kappa: int) -> list[int]:
    """Divisors e of ``extent`` with extent / e >= kappa and e <= p; [1] if none (§3)."""
    out = [e for e in range(1, min(extent, p) + 1) if extent % e == 0 and extent // e >= kappa]
    return out or [1]


def _contiguous(c, d) -> bool:
    """Ravel/Unravel filter (§4.10): leading fully split dims, one free dim, then only 1s."""
    i = 0
    while i < len(d) and c[i] == d[i]:
        i += 1
    return all(x == 1 for x in c[i + 1:])


def configurations(node: PaseNode, p: int, kappa: int) -> np.ndarray:
    """All configurations of ``node`` (rows, in D order) with product <= p, PaSE's space (§3)."""
    choices = [allowed_splits(x, p, kappa) for x in node.config_domain]
    rows: list[tuple[int, ...]] = []

    def grow(prefix: tuple[int, ...], used: int) -> None:
        if len(prefix) == len(choices):
            rows.append(prefix)
            return
        for e in choices[len(prefix)]:
            if used * e <= p:
                grow(prefix + (e,), used * e)

    grow((), 1)
    if node.op in ("Ravel", "Unravel"):
        rows = [c for c in rows if _contiguous(c, node.domain)]
    return np.array(rows, dtype=np.int64).reshape(len(rows), len(choices))


@dataclass
class PaseModel:
    """PaSE's cost model as an ``autopar.core.cost_model.CostModel`` over PaSE's graph: a node's
    layer cost L_v (§4) and an edge's EDGE_uv (§5) in FLOP-equivalents at word rate ``r``. The
    cluster is not read (PaSE prices every device alike, at ``r``); ``mode`` neither (PaSE's
    layer costs are a training step's)."""

    r: float = DEFAULT_R
    name: str = "pase"
    units: str = "pase-flop"

    def node_cost(self, node: PaseNode, configs: list[Config], cluster=None,
                  mode: str = "train") -> np.ndarray:
        return layer_cost(node, _rows(node, configs), self.r)

    def edge_cost(self, src: PaseNode, src_output: int, dst: PaseNode, dst_input: int,
                  src_configs: list[Config], dst_configs: list[Config], cluster=None,
                  mode: str = "train") -> np.ndarray:
        """EDGE over all config pairs, computed once per distinct pair of tensor configs."""
        s = tensor_config(src.out_maps[src_output], _rows(src, src_configs))
        t = tensor_config(dst.in_maps[dst_input], _rows(dst, dst_configs))
        su, si = np.unique(s, axis=0, return_inverse=True)
        tu, ti = np.unique(t, axis=0, return_inverse=True)
        small = edge_cost(dst.inputs[dst_input].shape, su, tu, self.r)
        return small[np.ix_(si.reshape(-1), ti.reshape(-1))]

    def output_cost(self, node: PaseNode, output: int, configs: list[Config], cluster=None,
                    mode: str = "train") -> np.ndarray:
        return np.zeros(len(configs))  # PaSE's objective has no term for the graph's outputs

    def node_breakdown(self, node: PaseNode, config: Config, cluster=None, mode: str = "train",
                       text: bool = True) -> NodeCost:
        cost = float(self.node_cost(node, [config])[0])
        formula = f"L_v of {node.op} at splits {config.splits}, r = {self.r:g}" if text else ""
        return NodeCost(f"{node.id}:{node.op}", config, [Term("PaSE layer cost", cost, formula)])


def _rows(node: PaseNode, configs: list[Config]) -> np.ndarray:
    rows = np.array([c.splits for c in configs], dtype=np.int64)
    return rows.reshape(len(configs), len(node.config_domain))


def pase_tables(graph: PaseGraph, p: int, kappa: int, r: float = DEFAULT_R) -> CostTables:
    """PaSE's search space and costs as ``CostTables`` (units "pase-flop", no mesh axes)."""
    model = PaseModel(r)
    configs = [[Config(splits=tuple(int(x) for x in row)) for row in configurations(n, p, kappa)]
               for n in graph.nodes]
    node_cost = [model.node_cost(n, c) for n, c in zip(graph.nodes, configs)]
    edges = {}
    for (u, v), e in graph.edges.items():
        if not u < v:
            raise ValueError(f"edge {u}->{v} goes backwards: nodes are not in topological order")
        edges[(u, v)] = model.edge_cost(graph.nodes[u], e.src_output, graph.nodes[v], e.dst_input,
                                        configs[u], configs[v])
    return CostTables(nodes=[f"{n.id}:{n.op}" for n in graph.nodes], configs=configs, node_cost=node_cost,
                      edge_cost=edges, units=model.units)


def evaluate(graph: PaseGraph, strategy: Mapping[int, tuple[int, ...]], r: float = DEFAULT_R,
             breakdown: bool = False):
    """F(G, phi) of one strategy (node id -> config tuple in D order), computed directly.

    With ``breakdown=True`` returns (total, {node id: L}, {(u, v): EDGE}).
    """
    rows = {}
    for n in graph.nodes:
        c = tuple(strategy[n.id])
        if len(c) != len(n.domain):
            raise ValueError(f"node {n.id} ({n.op}) needs {len(n.domain)} splits, got {c}")
        rows[n.id] = np.array([c], dtype=np.float64)
    layers = {n.id: float(layer_cost(n, rows[n.id], r)[0]) for n in graph.nodes}
    edges = {}
    for (u, v), e in graph.edges.items():
        s = tensor_config(graph.nodes[u].out_maps[e.src_output], rows[u])
        t = tensor_config(graph.nodes[v].in_maps[e.dst_input], rows[v])
        edges[(u, v)] = float(edge_cost(e.shape, s, t, r)[0, 0])
    total = math.fsum(layers.values()) + math.fsum(edges.values())
    return (total, layers, edges) if breakdown else total


def data_parallel(graph: PaseGraph, p: int, kappa: int) -> dict[int, tuple[int, ...]]:
    """Pure data parallelism (§8): each node splits only its batch axis, as far as allowed <= p."""
    out = {}
    for n in graph.nodes:
        c = [1] * len(n.domain)
        c[n.batch_axis] = max(allowed_splits(n.config_domain[n.batch_axis], p, kappa))
        out[n.id] = tuple(c)
    return out


def tables_for(graph, p: int, profile: str = "default", kappa: int | None = None,
               r: float = DEFAULT_R) -> tuple[PaseGraph, CostTables]:
    """View a traced ``ir.Graph`` as PaSE's graph and cost it; kappa defaults to the profile's.

    The tables' nodes are PaSE nodes (``PaseNode.sources`` names the ir nodes behind each).
    """
    from autopar.pase.view import PROFILES, pase_view

    prof = PROFILES[profile]
    g = pase_view(graph, prof)
    return g, pase_tables(g, p, prof.cutoff if kappa is None else kappa, r)


def choice_of(tables: CostTables, strategy: Mapping[int, tuple[int, ...]]) -> list[int]:
    """Config indices into ``tables`` for a strategy given as config tuples."""
    out = []
    for i, cfgs in enumerate(tables.configs):
        want = tuple(strategy[i])
        idx = next((j for j, c in enumerate(cfgs) if c.splits == want), None)
        if idx is None:
            raise KeyError(f"config {want} of node {tables.nodes[i]} is not in PaSE's space")
        out.append(idx)
    return out


__all__ = ["rate", "allowed_splits", "configurations", "pase_tables", "evaluate",
           "data_parallel", "choice_of", "tables_for", "DEFAULT_R", "PaseBuilder", "PaseGraph"]
