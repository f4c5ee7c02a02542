"""What a plan says about each node and stage, as data: the report and the picture read only this.

The planner fills these once, from the tables and the cost model that made the plan
(``planning/breakdown.py``), so a plan read from a file, or on any rank, prints the same report
without re-pricing anything. Numbers are in the plan's units (seconds, or PaSE's FLOP-equivalents).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

SPLIT_KINDS = ("replicated", "data", "tensor", "sequence", "reduction", "mixed")


@dataclass
class CostTerm:
    """One addend of a node's cost (``kind``: compute, sync, stats, optimizer, reshard, output)."""

    kind: str
    label: str
    seconds: float
    formula: str = ""


@dataclass
class NodeRow:
    """One node of the plan: how it is split and what it costs per step (or per microbatch)."""

    name: str
    module: str  # the display label: the module path, else the node name
    op: str
    split: str  # 'b/4, n/2' or 'replicated'
    split_kind: str = "replicated"  # one of SPLIT_KINDS, for the picture's colours
    params: str = "-"  # placements of its parameters per mesh axis, e.g. '(S(0), R)'
    outputs: str = "-"
    compute: float = 0.0
    comm: float = 0.0  # resharding its inputs + gradient sync + output reductions
    memory: float | None = None  # bytes per device (None: the model does not price memory)
    sync: float = 0.0  # in a pipelined plan: the once-per-step gradient sync, kept out of comm
    replicated_why: str = ""  # set when autopar has no split rule for the op
    sources: str = ""  # PaSE: the traced nodes its node stands for
    space: str = ""  # PaSE: the iteration space in PaSE's dim names
    terms: list[CostTerm] = field(default_factory=list)  # with their arithmetic when explained


@dataclass
class StageRow:
    """One pipeline stage as the planner priced it (per microbatch unless said otherwise)."""

    index: int
    first: int  # position of its first node in execution order
    last: int  # position of its last node (inclusive)
    devices: tuple[int, int]  # global ranks [start, end)
    time: float  # forward + backward of its nodes + sending/receiving at its cuts
    compute: float
    comm: float  # resharding inside the stage, output reductions
    send_recv: float  # activations and their gradients across its cuts
    sync: float  # once per step: its weight-gradient sync
    memory: float  # peak bytes per device: static + the in-flight microbatches' activations
    in_flight: int
    nodes: list[NodeRow] = field(default_factory=list)


def row_to_json(r: NodeRow) -> dict:
    d = dataclasses.asdict(r)
    d["terms"] = [dataclasses.asdict(t) for t in r.terms]
    return d


def row_from_json(d: dict) -> NodeRow:
    d = dict(d)
    d["terms"] = [CostTerm(**t) for t in d.get("terms", [])]
    return NodeRow(**d)


def stage_to_json(s: StageRow) -> dict:
    d = dataclasses.asdict(s)
    d["nodes"] = [row_to_json(r) for r in s.nodes]
    d["devices"] = list(s.devices)
    return d


def stage_from_json(d: dict) -> StageRow:
    d = dict(d)
    d["nodes"] = [row_from_json(r) for r in d.get("nodes", [])]
    d["devices"] = tuple(d["devices"])
    return StageRow(**d)
