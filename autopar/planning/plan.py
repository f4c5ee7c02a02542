"""``autopar.Plan``: the chosen config of every node, what it costs, and the baselines beside it.

A Plan is data: it can be saved, loaded, compared and reported without the model. The graph and
the cost tables it was made from ride along in memory (``plan.graph``, ``plan.tables``) for the
report and for codegen, but are not written to the file; the graph's fingerprint is.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from autopar.core.errors import PlanMismatchError
from autopar.core.strategy import Strategy
from autopar.core.tables import Config, Mesh
from autopar.planning import plan_file
from autopar.planning.plan_checks import check_document
from autopar.planning.rows import (
    NodeRow,
    StageRow,
    row_from_json,
    row_to_json,
    stage_from_json,
    stage_to_json,
)

SEARCH_STATUSES = ("optimal", "bound", "heuristic", "fixed")


@dataclass
class SearchInfo:
    """Which search produced the plan, how long it took, and what is proven about it.

    ``status`` says what the plan is, so that nothing claims an optimum it does not have:
    "optimal" (an exact search closed its bounds: gap 0), "bound" (an exact search stopped with a
    proven lower bound: ``gap`` is the relative distance to it), "heuristic" (some part was not
    searched exactly, ``detail`` says which: no bound is known) or "fixed" (a strategy priced, not
    searched: the baselines). The default is the weakest claim: a site must say it is exact.
    """

    name: str
    seconds: float
    gap: float = 0.0  # relative optimality gap against a proven lower bound ("bound" only)
    status: str = "heuristic"
    detail: str = ""  # for "heuristic": what was not searched exactly
    path: str = ""  # why this search ran where another was asked for (a budget the exact one would exceed)

    def __post_init__(self):
        if self.status not in SEARCH_STATUSES:
            raise ValueError(f"search status {self.status!r}: one of {', '.join(SEARCH_STATUSES)}")
        if self.status == "optimal" and self.gap > 0:
            self.status = "bound"

    @classmethod
    def exact(cls, name: str, seconds: float, gap: float) -> "SearchInfo":
        """A plan from an exact search (dp, ilp, brute) with the relative gap it proved."""
        if not math.isfinite(gap):
            return cls(name, seconds, 0.0, "heuristic", "the exact search proved no lower bound")
        return cls(name, seconds, gap, "optimal" if gap == 0 else "bound")

    @property
    def proven_optimal(self) -> bool:
        return self.status == "optimal"

    def describe(self) -> str:
        """One phrase for the report: what is proven about the plan (and why this search ran)."""
        return self._proven() + (f"; {self.path}" if self.path else "")

    def _proven(self) -> str:
        if self.status == "optimal":
            return "proven optimal under the cost model" + (f" ({self.detail})" if self.detail else "")
        if self.status == "bound":
            of = " of its space" if self.name == "hierarchical" else ""
            # a gap that rounds to 0.000% is still a gap: say so, not "at most 0.000%"
            at_most = f"at most {self.gap:.3%}" if self.gap >= 5e-6 else "less than 0.001%"
            return f"not proven optimal: {at_most} above the optimum{of} (proven lower bound)"
        if self.status == "fixed":
            return "a fixed strategy, priced, not searched"
        return "heuristic, no optimality bound" + (f" ({self.detail})" if self.detail else "")


@dataclass
class Stage:
    """One pipeline stage: a contiguous run of nodes on a group of devices."""

    nodes: list[str]
    devices: int
    cost: float = 0.0  # predicted time of one microbatch through the stage
    sync: float = 0.0  # its gradient sync, once per step
    memory: float | None = None  # peak bytes per device (None: not recorded, older plan files)
    # predicted compute seconds per step of one of its devices: its microbatches' forward and
    # backward and its optimizer update, communication left out (None: not recorded)
    compute: float | None = None


@dataclass
class Plan:
    model_name: str
    fingerprint: str
    cluster: dict[str, Any]  # the cluster as plain data (dataclasses.asdict of autopar.Cluster)
    mesh: Mesh
    cost_model: str
    space: str
    mode: str
    assignment: dict[str, Config]  # node name -> config
    cost: float  # predicted step time (seconds) or PaSE FLOP-equivalents, see ``units``
    units: str
    memory_per_device: float  # bytes
    search: SearchInfo
    stages: list[Stage] = field(default_factory=list)
    microbatches: int = 1
    schedule: str = ""  # "gpipe" / "1f1b" when pipelined
    unsupported: dict[str, str] = field(default_factory=dict)  # node -> why it is replicated
    baselines: dict[str, "Plan"] = field(default_factory=dict)
    # What the report prints, computed with the plan (planning/breakdown.py) and saved with it:
    rows: list[NodeRow] = field(default_factory=list, repr=False)  # per node (single-stage plans)
    stage_rows: list[StageRow] = field(default_factory=list, repr=False)  # per stage (pipelined)
    stage_mesh: tuple[int, ...] = ()  # the mesh of one stage's devices (pipelined)
    batch: int | None = None  # the global batch the plan was made for (pipelined: split in microbatches)
    explanation: list[str] = field(default_factory=list, repr=False)  # every term's arithmetic
    pase_rate: float | None = None  # PaSE plans: the FLOP-per-word rate r of its tables
    notices: list[str] = field(default_factory=list, repr=False)  # what the report must say (mesh axes unused, why)
    # ZeRO stage, precision, recomputed blocks, degrees (hierarchical plans): what codegen applies
    strategy: Strategy | None = None
    graph: Any = field(default=None, repr=False, compare=False)  # ir.Graph (or PaSE view), not saved
    tables: Any = field(default=None, repr=False, compare=False)  # CostTables, not saved

    @property
    def devices(self) -> int:
        return self.mesh.size

    def speedup_over(self, baseline: str) -> float:
        """``baselines[baseline].cost / cost``: how much faster this plan is predicted to be."""
        if baseline not in self.baselines:
            raise ValueError(f"this plan has no baseline {baseline!r}; it has: "
                             f"{', '.join(self.baselines) or 'none (planned with baselines=False)'}")
        other = self.baselines[baseline].cost
        if self.cost == 0:  # a hand-edited plan priced at nothing: no ratio to give
            return math.inf if other else math.nan
        return other / self.cost

    def report(self, **kwargs) -> str:
        if self.strategy is not None and self.strategy.degrees is not None:  # a hierarchical plan
            from autopar.report.scale import format_scale_report

            return format_scale_report(self)
        from autopar.report.table import format_report

        return format_report(self, **kwargs)

    # -- files ---------------------------------------------------------------------------------

    def to_json(self) -> dict:
        doc = {
            "format": "autopar-plan",
            "schema": plan_file.SCHEMA,
            "model_name": self.model_name,
            "fingerprint": self.fingerprint,
            "cluster": self.cluster,
            "mesh": plan_file.mesh_to_json(self.mesh),
            "cost_model": self.cost_model,
            "space": self.space,
            "mode": self.mode,
            "cost": self.cost,
            "units": self.units,
            "memory_per_device": self.memory_per_device,
            "search": dataclasses.asdict(self.search),
            "stages": [dataclasses.asdict(s) for s in self.stages],
            "microbatches": self.microbatches,
            "schedule": self.schedule,
            "unsupported": self.unsupported,
            "assignment": {k: plan_file.config_to_json(c) for k, c in self.assignment.items()},
            "rows": [row_to_json(r) for r in self.rows],
            "stage_rows": [stage_to_json(s) for s in self.stage_rows],
            "stage_mesh": list(self.stage_mesh),
            "batch": self.batch,
            "explanation": self.explanation,
            "pase_rate": self.pase_rate,
            "notices": self.notices,
            "strategy": self.strategy.to_json() if self.strategy else None,
            "baselines": {k: b.to_json() for k, b in self.baselines.items()},
        }
        return doc

    def save(self, path) -> None:
        plan_file.write(path, self.to_json())

    @classmethod
    def from_json(cls, doc: dict) -> "Plan":
        check_document(doc)  # planning/plan_checks.py: one line for the first impossible field
        try:
            return cls(
                model_name=doc["model_name"],
                fingerprint=doc["fingerprint"],
                cluster=doc["cluster"],
                mesh=plan_file.mesh_from_json(doc["mesh"]),
                cost_model=doc["cost_model"],
                space=doc["space"],
                mode=doc["mode"],
                assignment={k: plan_file.config_from_json(c) for k, c in doc["assignment"].items()},
                cost=float(doc["cost"]),
                units=doc["units"],
                memory_per_device=float(doc["memory_per_device"]),
                search=_search_from_json(doc["search"]),
                stages=[Stage(**s) for s in doc.get("stages", [])],
                microbatches=int(doc.get("microbatches", 1)),
                schedule=doc.get("schedule", ""),
                unsupported=dict(doc.get("unsupported", {})),
                baselines={k: cls.from_json(b) for k, b in doc.get("baselines", {}).items()},
                rows=[row_from_json(r) for r in doc.get("rows", [])],
                stage_rows=[stage_from_json(r) for r in doc.get("stage_rows", [])],
                stage_mesh=tuple(doc.get("stage_mesh", ())),
                batch=doc.get("batch"),
                explanation=list(doc.get("explanation", [])),
                pase_rate=doc.get("pase_rate"),
                notices=[str(n) for n in doc.get("notices", [])],
                strategy=Strategy.from_json(doc["strategy"]) if doc.get("strategy") else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise PlanMismatchError(f"corrupt plan file: missing or bad field {e}") from None

    @classmethod
    def load(cls, path, graph=None, cluster=None, mode: str | None = None) -> "Plan":
        """Read a plan, refusing one that cannot run as written (``plan_file.check``); with
        ``graph``/``cluster``/``mode`` given, refuse one made for something else."""
        plan = cls.from_json(plan_file.read(path))
        plan_file.check(plan, str(path), mode=mode)
        if graph is not None:
            from autopar.core.fingerprint import fingerprint

            fp = fingerprint(graph)
            if fp != plan.fingerprint:
                raise PlanMismatchError(
                    f"{path} was planned for another model ({plan.model_name or '?'}, graph {plan.fingerprint}); "
                    f"this model's graph is {fp}: re-plan it"
                )
            plan_file.check(plan, str(path), graph)
        if cluster is not None:
            theirs = dataclasses.asdict(cluster) if dataclasses.is_dataclass(cluster) else dict(cluster)
            if _cluster_key(theirs) != _cluster_key(plan.cluster):
                raise PlanMismatchError(
                    f"{path} was planned for cluster {plan.cluster.get('name', '?')} "
                    f"({plan.cluster.get('devices', '?')} devices), not {theirs.get('name', '?')} "
                    f"({theirs.get('devices', '?')} devices): re-plan for this cluster"
                )
        return plan


def _cluster_key(d: dict) -> dict:
    """A cluster's fields as a plan file holds them (tuples as lists), less those at their
    defaults, so that a file written before a field existed still matches its cluster."""
    from autopar.core.cluster import Cluster

    defaults = json.loads(json.dumps(dataclasses.asdict(Cluster())))
    d = json.loads(json.dumps(d))
    return {k: v for k, v in d.items() if k == "devices" or k == "name" or defaults.get(k, object()) != v}


def _search_from_json(d: dict) -> SearchInfo:
    """Plan files written before ``status`` existed: an exact search's name with gap 0 claimed an
    optimum then; they read back as what they claimed, anything else as heuristic."""
    d = dict(d)
    if "status" not in d:
        exact = d.get("name") in ("dp", "ilp", "brute", "dp+ilp")
        d["status"] = ("optimal" if float(d.get("gap", 0.0)) == 0 else "bound") if exact else (
            "fixed" if d.get("name") == "fixed" else "heuristic")
    return SearchInfo(**d)
