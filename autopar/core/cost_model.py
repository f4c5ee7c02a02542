"""What a cost model is: the contract through which the planner prices a graph.

A search only ever sees ``CostTables``; a cost model fills them, node by node and edge by edge,
for the configs of the space (``core.space``). The analytic model (datasheets and alpha-beta
links), the profiled one (compute measured on the device) and PaSE's (FLOP-equivalents on PaSE's
view of the graph) all implement ``CostModel``; so can a model written outside autopar, which
``autopar.plan(..., cost_model=obj)`` then plans with like any other.

A node's cost is a sum of ``Term``s; readers branch on a term's ``kind`` (a pipeline takes the
"sync" terms out of the per-microbatch time, the report splits "compute" from communication),
never on its label.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from autopar.core.tables import Config

TERM_KINDS = ("compute", "sync", "stats", "exchange", "optimizer", "infeasible")


@dataclass(frozen=True)
class Term:
    """One addend of a node's cost: what it is, its seconds and the arithmetic behind them.

    ``kind`` is what readers branch on (a pipeline takes "sync" out of the per-microbatch time;
    the report splits "compute" from communication); ``label`` is only for people."""

    label: str
    seconds: float
    formula: str = ""
    kind: str = "compute"


@dataclass
class NodeCost:
    """Every term of one node's cost under one config."""

    node: str
    config: Config
    terms: list[Term] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.terms)


@runtime_checkable
class CostModel(Protocol):
    """A cost model, as the planner uses it. Costs are in ``units`` ("s" for a step's seconds).

    ``node`` is a graph node of the priced space (an ``ir.Node`` on the device mesh, a
    ``PaseNode`` in PaSE's space), ``configs`` its configs in the space's order, ``cluster`` the
    ``Cluster`` priced on, ``mode`` "train" (forward, backward, gradient syncs, update) or
    "inference". Arrays are float, ``inf`` where a config cannot run.
    """

    name: str
    units: str

    def node_cost(self, node: Any, configs: list[Config], cluster: Any, mode: str = "train") -> np.ndarray:
        """The node's cost under each config: shape ``(len(configs),)``."""
        ...

    def edge_cost(self, src: Any, src_output: int, dst: Any, dst_input: int, src_configs: list[Config],
                  dst_configs: list[Config], cluster: Any, mode: str = "train") -> np.ndarray:
        """Moving ``src``'s output ``src_output`` to ``dst``'s input ``dst_input`` (and, in
        training, its gradient back): shape ``(len(src_configs), len(dst_configs))``."""
        ...

    def output_cost(self, node: Any, output: int, configs: list[Config], cluster: Any,
                    mode: str = "train") -> np.ndarray:
        """What returning a graph output under each config adds (zeros where nothing)."""
        ...

    def node_breakdown(self, node: Any, config: Config, cluster: Any, mode: str = "train",
                       text: bool = True) -> NodeCost:
        """The terms of ``node_cost`` under one config (``text``: with their formulas); their sum
        is that config's entry of ``node_cost``."""
        ...
