"""The strategy-quality suite: which models autopar plans, on what, and what PaSE published for them.

A case is data only; ``plan_case`` turns it into an ``autopar.Plan``. PaSE's four models are planned
under PaSE's own cost model and space at its batch sizes (docs/pase.md §7-§8), so autopar's
numbers can be read against the published optimum and search times; GPT and the MLP are planned on
real cluster presets under the analytic model, one GPT too big for data parallelism to fit.
"""

from __future__ import annotations

import dataclasses
import inspect

import autopar

GiB = 2**30
PASE_DEVICES = (4, 8, 16, 32, 64)

# docs/pase.md §8: DP cost / optimum under PaSE's model (r = 5000), for the models it lists.
PASE_RATIO = {
    "alexnet": {4: 3.897, 8: 6.191, 16: 8.716, 32: 11.645, 64: 15.048},
    "rnnlm": {4: 1.374, 8: 1.764, 16: 2.397, 32: 3.586, 64: 5.406},
}
# docs/pase.md §10, Table I: PaSE's search time in seconds (Xeon E5 host).
PASE_SEARCH_S = {
    "alexnet": {4: 0.23, 8: 0.25, 16: 0.30, 32: 0.36, 64: 0.48},
    "inception3": {4: 14.4, 8: 20.0, 16: 39.8, 32: 86.0, 64: 196.0},
    "rnnlm": {4: 0.06, 8: 0.09, 16: 0.07, 32: 0.13, 64: 0.22},
    "transformer": {4: 9.8, 8: 28.8, 16: 131.0, 32: 553.0, 64: 1883.0},
}
PASE_SPACE = {"alexnet": "pase", "inception3": "pase", "rnnlm": "pase:1", "transformer": "pase:1"}
PASE_BATCH = {"alexnet": 128, "inception3": 128, "rnnlm": 64, "transformer": 64}


@dataclasses.dataclass(frozen=True)
class Case:
    """One plan to price. ``cluster`` is a preset name or a device count (``autopar.Cluster(devices=p)``)."""

    name: str
    model: str  # autopar.zoo name
    batch: int
    cluster: str | int
    sizes: tuple[tuple[str, int], ...] = ()  # zoo sizes other than batch, as pairs so the case stays hashable
    cost_model: str = "analytic"
    space: str = "mesh"
    memory_capacity: float | None = None  # bytes per device; None keeps the cluster's
    pipeline: bool = False  # passed only where autopar.plan takes it (pipeline stages are being integrated)
    fast: bool = False  # in the regression test (tests/planning/test_regression.py): plans in about a second
    pase_ratio: float | None = None  # PaSE's published DP / optimum, where pase.md §8 gives it
    pase_search_s: float | None = None  # PaSE's published search time, pase.md §10 Table I
    # the analytic cases price fp32 training, as they did before mixed precision became the
    # default on GPU clusters: the suite tracks the searches and the model, not the default
    precision: str | None = "fp32"

    @property
    def devices(self) -> int:
        return self.cluster if isinstance(self.cluster, int) else autopar.Cluster.preset(self.cluster).devices

    def hardware(self) -> autopar.Cluster:
        """The cluster the case prices: its preset, or for a device count ``autopar.Cluster(devices=p)``
        (a bare count given to ``autopar.plan`` would be the default cluster, the local machine)."""
        if isinstance(self.cluster, int):
            return autopar.Cluster(devices=self.cluster)
        return autopar.Cluster.preset(self.cluster)


def _pase_cases() -> list[Case]:
    fast = {("alexnet", 4), ("alexnet", 16), ("rnnlm", 4), ("rnnlm", 16), ("rnnlm", 64)}
    return [Case(name=f"{m}-p{p}", model=m, batch=PASE_BATCH[m], cluster=p, cost_model="pase",
                 space=PASE_SPACE[m], fast=(m, p) in fast, pase_ratio=PASE_RATIO.get(m, {}).get(p),
                 pase_search_s=PASE_SEARCH_S[m][p])
            for m in ("alexnet", "inception3", "rnnlm", "transformer") for p in PASE_DEVICES]


# A GPT whose Adam state does not fit under data parallelism at 16 GiB (DP needs ~31.5 GiB per device).
BIG_GPT = (("seq", 1024), ("width", 4096), ("heads", 32), ("layers", 8), ("vocab", 32000))
BIG_GPT_CAPACITY = 16 * GiB
MLP = (("inputs", 1024), ("hidden", 4096), ("layers", 4), ("classes", 1000))


def _analytic_cases() -> list[Case]:
    out = []
    for cluster in ("8xA100", "2x8xH100"):
        tag = cluster.lower()
        out += [
            Case(f"mlp-{tag}", "mlp", 512, cluster, sizes=MLP, fast=True),
            Case(f"gpt-small-{tag}", "gpt", 8, cluster, fast=True),
            Case(f"gpt-8x4096-{tag}-16GiB", "gpt", 8, cluster, sizes=BIG_GPT, memory_capacity=BIG_GPT_CAPACITY,
                 fast=cluster == "8xA100"),
        ]
    return out


SUITE: list[Case] = _pase_cases() + _analytic_cases()


def by_name(cases: list[Case] = SUITE) -> dict[str, Case]:
    return {c.name: c for c in cases}


def build(case: Case):
    """``(model, example_inputs)`` on the meta device: planning never needs real weights."""
    return autopar.zoo.get(case.model, batch=case.batch, device="meta", **dict(case.sizes))


def accepts_pipeline() -> bool:
    """Whether ``autopar.plan`` takes ``pipeline=`` (it forwards **kwargs to ``autopar.planning.planner.plan``)."""
    for fn in (autopar.plan, _planner_plan()):
        params = inspect.signature(fn).parameters
        if "pipeline" in params:
            return True
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return False
    return False


def _planner_plan():
    from autopar.planning.planner import plan

    return plan


def plan_kwargs(case: Case) -> dict:
    kw = dict(cost_model=case.cost_model, space=case.space, memory_capacity=case.memory_capacity,
              model_name=case.model)
    if case.cost_model != "pase":
        kw["precision"] = case.precision
    if accepts_pipeline():
        kw["pipeline"] = case.pipeline
    return kw


def capacity(case: Case) -> float:
    """Bytes per device the plan must fit in: the case's device memory (its limit, else the
    cluster's) less the safety margin that the planner keeps and compile enforces."""
    from autopar.core.margin import usable_memory

    device = case.memory_capacity if case.memory_capacity is not None else case.hardware().memory_capacity
    return usable_memory(float(device))


def plan_case(case: Case, model_inputs=None, graph=None) -> autopar.Plan:
    model, inputs = model_inputs if model_inputs is not None else build(case)
    return autopar.plan(model, inputs, case.hardware(), graph=graph, **plan_kwargs(case))
