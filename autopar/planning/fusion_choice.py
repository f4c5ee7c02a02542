"""Fuse or not: K models of one architecture priced one by one, fused, and fused in groups of k.

Measured on a 2-core CPU, fusion is not always a win: fused small MLPs ran 1.6x faster,
fused small CNNs 1.3x, fused GPTs 0.93x (bigger operands fall out of cache, and there is no idle
hardware for a fused kernel to fill). So the choice is the cost model's: each candidate group
size k is traced as the fused module it would be (``autopar.fusion.fuse``), priced on one device
by the same cost model (forward, backward and the optimizer's update), and the K models cost
ceil(K / k) such groups run one after another. Fusion is taken only where it is predicted
strictly faster and fits the device's memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autopar.core.cluster import Cluster
from autopar.core.errors import TraceError
from autopar.core.margin import usable_memory


@dataclass
class FusionPrice:
    """One candidate: ``k`` models per fused group (1: one by one)."""

    k: int
    group_seconds: float  # one training step of one group of k
    total_seconds: float  # one step of all K models: the groups in turn
    memory: float  # bytes one group holds
    fits: bool


@dataclass
class FusionChoice:
    models: int
    k: int  # the chosen group size (1: not fused)
    prices: list[FusionPrice] = field(default_factory=list)
    cost_model: str = "profiled"
    note: str = ""

    def price(self, k: int) -> FusionPrice:
        return next(p for p in self.prices if p.k == k)

    @property
    def why(self) -> str:
        one = self.price(1)
        best = self.price(self.k)
        if self.k == 1:
            fused = [p for p in self.prices if p.k > 1 and p.fits]
            if not fused:
                return self.note or "no fused group fits the device"
            f = min(fused, key=lambda p: p.total_seconds)
            return (f"one by one: {one.total_seconds * 1e3:.3g} ms per step of all {self.models}, "
                    f"fused by {f.k} {f.total_seconds * 1e3:.3g} ms ({self.cost_model} model): fusion predicted slower")
        return (f"fused by {self.k}: {best.total_seconds * 1e3:.3g} ms per step of all {self.models} vs "
                f"{one.total_seconds * 1e3:.3g} ms one by one ({self.cost_model} model), "
                f"{one.total_seconds / best.total_seconds:.2f}x")


def group_sizes(k: int) -> list[int]:
    """1, the powers of two below K, and K."""
    sizes = {1, k}
    p = 2
    while p < k:
        sizes.add(p)
        p *= 2
    return sorted(sizes)


def step_on_one_device(module, example_inputs, cluster: Cluster, cost_model, optimizer: str | None,
                       mode: str = "train") -> tuple[float, float]:
    """(seconds, bytes) of one training step of ``module`` on one device of ``cluster``."""
    from autopar.cost_models.tables import build_tables
    from autopar.frontend.trace import trace

    graph = trace(module, example_inputs, progress=False)
    one = cluster.with_devices(1)
    tables = build_tables(graph, one, cost_model, space="mesh", mode=mode, optimizer=optimizer)
    choice = [0] * len(tables.nodes)  # one device: every node has the one unsplit config
    return float(tables.total(choice)), float(tables.total_memory(choice))


def make_cost_model(name: str, optimizer: str | None, rounds: int = 5, device: str = "cpu"):
    """A cost model object by name: 'analytic', or 'profiled' (measured on ``device``, cached on
    disk; each op's time the least of ``rounds`` medians, see ``steady_profiled_model``)."""
    if name == "analytic":
        from autopar.cost_models.analytic import AnalyticModel

        return AnalyticModel()
    if name == "profiled":
        return steady_profiled_model(optimizer, rounds, device)
    raise ValueError(f"cost model for fusion must be 'analytic' or 'profiled', not {name!r}")


def steady_profiled_model(optimizer: str | None, rounds: int = 5, device: str = "cpu"):
    """The profiled model, each op timed as the least of ``rounds`` medians of 5 runs.

    Fusion is decided by differences of a few percent between two pricings of the same work, and
    on a machine shared with other jobs an op timed during someone else's burst reads slow for
    all the runs of one median: a burst only ever adds time, so the least of a few medians taken
    apart is the steadier figure. Stored apart from the plain model's timings (its own device key).
    """
    from autopar.cost_models.profiled import ProfiledModel

    class SteadyProfiledModel(ProfiledModel):
        def __post_init__(self) -> None:
            super().__post_init__()
            self._device = f"{self._device}:least-of-{rounds}"

        def _measure(self, node, config):
            runs = [super(SteadyProfiledModel, self)._measure(node, config) for _ in range(rounds)]
            ok = [t for t in runs if not t.error]
            return min(ok, key=lambda t: t.forward + t.backward) if ok else runs[0]

        def _measure_optimizer(self, shapes):
            runs = [super(SteadyProfiledModel, self)._measure_optimizer(shapes) for _ in range(rounds)]
            ok = [t for t in runs if not t.error]
            return min(ok, key=lambda t: t.forward) if ok else runs[0]

    return SteadyProfiledModel(optimizer=optimizer, fit_comm=False, device=device)


def choose_fusion(models, example_inputs, cluster: Cluster, *, cost_model="profiled",
                  optimizer: str | None = "adamw", sizes: list[int] | None = None, inputs: str = "shared",
                  fused_inputs=None, device: str = "cpu") -> FusionChoice:
    """Price ``models`` (one architecture) one by one and fused in groups; pick the cheapest.

    ``cost_model``: "profiled" (measured on the local machine's ``device``), "analytic", or a cost model object.
    ``inputs``/``fused_inputs``: how the fused module takes its data ("shared": the models'
    common example inputs; "stacked": ``fused_inputs``, the models' inputs stacked)."""
    from autopar.fusion import fuse

    k_all = len(models)
    sizes = sorted(set(sizes or group_sizes(k_all)) | {1})
    if any(s < 1 or s > k_all for s in sizes):
        raise ValueError(f"group sizes must be between 1 and {k_all}, got {sizes}")
    model = make_cost_model(cost_model, optimizer, device=device) if isinstance(cost_model, str) else cost_model
    label = cost_model if isinstance(cost_model, str) else getattr(cost_model, "name", type(cost_model).__name__)
    capacity = usable_memory(cluster.memory_capacity)  # what a group may use (core/margin.py)
    step: dict[int, tuple[float, float]] = {}

    def price_group(k: int) -> tuple[float, float]:
        if k not in step:
            if k == 1:
                step[k] = step_on_one_device(models[0], example_inputs, cluster, model, optimizer)
            else:
                data = example_inputs if inputs == "shared" else tuple(x[:k] for x in fused_inputs)
                fused = fuse(models[:k], example_inputs, inputs=inputs)
                step[k] = step_on_one_device(fused, data, cluster, model, optimizer)
        return step[k]

    prices, note = [], ""
    for k in sizes:
        try:
            seconds, memory = price_group(k)
            full, rest = divmod(k_all, k)
            total = full * seconds + (price_group(rest)[0] if rest else 0.0)
        except TraceError as e:  # not fusable: one by one, and the report says why
            note = str(e)
            break
        prices.append(FusionPrice(k, seconds, total, memory, memory <= capacity))
    fitting = [p for p in prices if p.fits] or prices[:1]
    best = min(fitting, key=lambda p: (p.total_seconds, p.k))
    return FusionChoice(k_all, best.k, prices, label, note)

