"""Planning at the scale of a cluster's structure, not its prime factors.

Used automatically (``use_hierarchical``) when the flat prime-factor space would be too large:
more than ``FLAT_LIMIT`` = 64 devices (beyond it the flat space has 7+ mesh axes and the exact DP
takes minutes and gigabytes), or a cluster of several pods. The space (``degrees.py``): per level
(in-node, across nodes, across pods) tensor x pipeline x data degrees, and for a causal language
model context degrees carved out of the data degrees (``context.context_options``); per candidate a microbatch
count, a pipeline schedule (``step_price.SCHEDULES``), a ZeRO stage (over all data-parallel
devices or only inside pods), per-block recomputation, and the precision. The search is exact over that space under the cost model:

1. every candidate gets a lower bound (``step_bounds.lower_bound``: compute at peak with its
   bubble, perfectly sharded sync and optimizer) and a memory floor; candidates whose floor
   exceeds the devices' memory are dropped;
2. candidates are priced in order of their bound (``step_price.price``), each tensor group's
   layout by the exact DP on the whole graph at microbatch size (``units.py``; repeated blocks
   solved once, shared by every candidate with the same group shape, microbatch and recompute);
3. the search stops when the next bound is no lower than the best fitting plan: that plan is
   optimal over the space.

Not exact, stated in the plan (``SearchInfo``: status "bound"): the layout of each tensor group is
the one that minimises its per-microbatch time, not the best jointly with memory and the syncs.
The gap reported is against a lower bound on the best plan of the space *with any layout*
(docs/bound.md): the least, over the candidates whose memory floor fits, of the tightest bound
each got that holds for every layout (``step_bounds.layout_bound`` once its group is solved). The
space itself (uniform degrees over the model, cuts at block boundaries, ZeRO over the data axes
only) is what the bound is over.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import math
import time

import numpy as np

from autopar.core.block_runs import run_window
from autopar.core.blocks import apply_training, block_window, repeated_blocks, units
from autopar.core.cluster import Cluster
from autopar.core.errors import InfeasibleError
from autopar.core.ir import Graph
from autopar.core.margin import capacity_words, usable_memory
from autopar.core.strategy import PRECISIONS, RECOMPUTE_ATTENTION, Degrees, Strategy, default_precision
from autopar.cost_models.analytic import AnalyticModel
from autopar.planning.accumulation import steps
from autopar.planning.activations import attention_core, attention_flops, attention_recompute, price_fitting
from autopar.planning.context import context_options, exchange_times, kv_bytes, rank_stats, unit_attention_flops
from autopar.planning.degrees import Pin, divisors, expert_options, level_degrees, pin_schedules, with_context
from autopar.planning.early_memory import early_memory_floor
from autopar.planning.every import every_of, every_stats, options_of, per_unit, reference_mode, searched_recomputes
from autopar.planning.plan import Plan, SearchInfo, Stage
from autopar.planning.routed import ExpertStats, expert_count, expert_stats
from autopar.planning.lagrangian import tighten
from autopar.planning.settings import TrainingSettings
from autopar.planning.least_time import least_time
from autopar.planning.space_bound import any_layout_bound, memory_floor
from autopar.planning.step_bounds import least_totals, lower_bound, reference_bound, stats_bound, sync_lb, totals
from autopar.planning.step_price import SCHEDULES, Candidate, weighed, Priced, data_groups, price, schedule_options
from autopar.planning.units import UnitStats, unit_stats
from autopar.search.common import SearchTooLargeError
from autopar.planning.hierarchical_plan import assignment_of, mesh_of, to_plan  # noqa: F401  (also imported from here)

FLAT_LIMIT = 64  # devices the flat prime-factor space handles (tests/search/test_search*.py)
DETAIL = ("exact over degrees per level (context degrees where attention is causal over the sequence) x microbatches x pipeline schedule x ZeRO x recomputation, tensor-group layouts by the exact DP, pipeline cuts at block boundaries; gap against a lower bound on the best plan of that "
          "space, any tensor-group layout (docs/bound.md)")


def use_hierarchical(cluster: Cluster) -> bool:
    """The rule: more devices than the flat space handles, or more than one pod."""
    return cluster.devices > FLAT_LIMIT or cluster.pods > 1


def wanted(hierarchical, cluster: Cluster, pin, cost_model: str) -> bool:
    """Whether ``autopar.plan`` takes this path: ``hierarchical`` True / False / "auto" (the rule
    of ``use_hierarchical``, or a pin, which only this search understands)."""
    if hierarchical not in (True, False, "auto"):
        raise ValueError(f"hierarchical must be True, False or 'auto', not {hierarchical!r}")
    if hierarchical is False:
        if pin is not None:
            raise ValueError("a pin (tensor=..,pipeline=..,data=..) needs the hierarchical search")
        return False
    want = hierarchical is True or pin is not None or use_hierarchical(cluster)
    if want and cost_model != "analytic":
        if hierarchical is True or pin is not None:
            raise ValueError(f"the hierarchical search prices with the analytic model, not {cost_model!r}")
        return False
    return want


def _batch(graph: Graph) -> int:
    for spec in graph.inputs.values():
        if spec.shape:
            return spec.shape[0]
    raise ValueError("the hierarchical search needs a batched graph input (its first axis is split)")


class Search:
    """One hierarchical search: the graph under each option set, memoised group solutions."""

    def __init__(self, graph: Graph, cluster: Cluster, precision: str, optimizer, mode: str, capacity: float,
                 solve, max_tensor: int = 64):
        self.graph, self.cluster, self.precision = graph, cluster, precision
        self.optimizer, self.mode, self.capacity, self.solve = optimizer, mode, capacity, solve
        # the figures' model (the cluster's efficiency, terms at face value); what a group's layout minimises
        self.model, self.objective = AnalyticModel(), AnalyticModel(sync_scale=0.0)
        self.blocks = repeated_blocks(graph)
        self.spans = units(graph, self.blocks)
        self.batch = _batch(graph)
        self.levels = cluster.levels()
        self.max_tensor = max_tensor
        self.accumulate = 0  # microbatches a step when asked for (``accumulation.steps``); 0: searched
        self._graphs, self._windows, self._memo, self._ranks = {}, {}, {}, {}  # graphs, windows, UnitStats; per rank
        self._kv: dict[bool, tuple] = {}  # K/V bytes and attention's seconds per unit (context parallelism)
        self._experts: dict[tuple, ExpertStats | None] = {}
        self.experts = expert_count(graph)  # routed experts per MoE layer (0: none): the expert degree's range
        # context degrees searched (planning/context.py); not beside routed experts, whose
        # all-to-all this space prices over data-parallel devices only
        self.contexts = () if self.experts else context_options(graph)
        self.floors: dict[tuple, np.ndarray] = {}  # space_bound.unit_floors per group
        self.solves = 0
        self.refused: set[Candidate] = set()  # candidates whose group's DP refused its tables
        self.space_bound = math.inf  # set by ``best``: a lower bound on the optimum of its space
        dtype = PRECISIONS[precision]
        self.peak = cluster.peak(dtype)
        self.eff = self.model.efficiency(cluster)
        self.master = precision != "fp32"
        self.itemsize = 2 if self.master else 4
        self.totals = totals(self.training_graph(False), self.model.backward_factor)
        self.attention = bool(attention_core(self.graph))  # attention-only recompute has a core to re-run
        self.totals = dataclasses.replace(self.totals, attention_flops=attention_flops(self.training_graph(False)))
        self.least = least_totals(self.training_graph(False), self.model.backward_factor)  # what the bounds count

    def training_graph(self, recompute: bool | str) -> Graph:
        if recompute == RECOMPUTE_ATTENTION and recompute not in self._graphs:
            self._graphs[recompute] = attention_recompute(self.training_graph(False))
        if recompute not in self._graphs:
            self._graphs[recompute] = apply_training(self.graph, options_of(recompute, precision=self.precision))
        return self._graphs[recompute]

    def window(self, recompute: bool):
        if every_of(recompute):  # priced on the window of full recomputation (planning/every.py)
            return self.window(True)
        if recompute not in self._windows:
            g = self.training_graph(recompute)
            self._windows[recompute] = block_window(g) or run_window(g)
        return self._windows[recompute]

    def _stats(self, tensor: tuple[int, int], microbatches: int, recompute: bool) -> UnitStats:
        key = (tensor, microbatches, recompute)
        if key not in self._memo:
            if every_of(recompute):  # one layout, each unit priced as its block is (planning/every.py)
                self._memo[key] = every_stats(self, tensor, microbatches, every_of(recompute))
            else:
                self.solves += 1
                self._memo[key] = unit_stats(self.training_graph(recompute), self.spans, self.cluster, tensor, microbatches,
                                             self.objective, self.solve, self.mode, self.optimizer, self.window(recompute))
        return self._memo[key]

    def whole_stats(self, recompute: bool) -> UnitStats:
        """The graph unsplit on one device at the whole batch: every unit's own state and activations."""
        return self._stats((1, 1), 1, recompute)

    def group_key(self, c: Candidate) -> tuple:
        return (self._tensor(c), c.degrees.d * c.microbatches, c.recompute)

    @staticmethod
    def _tensor(c: Candidate) -> tuple[int, int]:
        return tuple((c.degrees.tensor + (1, 1))[:2])

    def stats(self, c: Candidate) -> UnitStats:
        s = self._stats(self._tensor(c), c.degrees.d * c.microbatches, c.recompute)
        return self._context(c, s) if c.degrees.c > 1 else s

    def _context(self, c: Candidate, s: UnitStats | None) -> UnitStats:
        """``s`` for one rank of ``c``'s context group (``planning/context.py``); ``s`` None: ``gathers``' seconds."""
        if (key := (c.degrees, c.microbatches, c.recompute, s is None)) not in self._ranks:
            link, call = self._kv_link(c), self.cluster.call_latency  # every k-th block: per unit (every.py)
            self._ranks[key] = (float(np.sum(per_unit(self, c.recompute, lambda rc: exchange_times(*link, call, rc))))
                                if s is None else per_unit(self, c.recompute, lambda rc: rank_stats(s, *link, call, rc)))
        return self._ranks[key]

    def _kv_link(self, c: Candidate) -> tuple:
        """Per unit and microbatch of ``c``: K/V bytes, one device's attention seconds; degrees; link."""
        if c.recompute not in self._kv:
            g = self.training_graph(c.recompute)
            attention = unit_attention_flops(g, self.spans) / (self.peak * self.eff)
            self._kv[c.recompute] = (kv_bytes(g, self.spans), attention)
        deg, (kv, attention) = c.degrees, self._kv[c.recompute]
        bw, lat = self.cluster.link(min(max(l for l, k in enumerate(deg.context) if k > 1), 2))
        return kv / (deg.d * c.microbatches), attention / (deg.d * c.microbatches), deg, bw, lat

    def gathers(self, c: Candidate) -> float:
        """Seconds per microbatch of the K/V gathers of one context rank over all units: what
        any layout of ``c`` adds to its ranks' time, whatever the tensor group's layout (0
        without context parallelism). The slowest of its p stages takes at least 1/p of it."""
        return self._context(c, None) if c.degrees.c > 1 else 0.0

    def expert_stats(self, c: Candidate) -> ExpertStats | None:
        """The routed experts' part of ``stats(c)`` (None without experts or expert parallelism)."""
        if not self.experts or c.degrees.ep <= 1:
            return None
        key = (self._tensor(c), c.degrees.d * c.microbatches, c.recompute)
        if key not in self._experts:
            self._experts[key] = expert_stats(self.stats(c), self.mode, self.optimizer)
        return self._experts[key]

    def reference(self, c: Candidate) -> tuple[float, int]:
        """(T, b') for ``step_bounds.reference_bound``: of the group's solved microbatch sizes b' that are
        multiples of the candidate's b (the whole batch always is: solved first), the largest ``b/b' T(b')``,
        under its recomputation or none (every recomputation runs what none runs and some forward again,
        under any layout: only none's is solved here, a group spanning nodes taking seconds a solve)."""
        tensor, b = self._tensor(c), self.batch // (c.degrees.d * c.microbatches)
        rec = reference_mode(c.recompute)  # every k-th and pointwise take no less than none
        self._stats(tensor, 1, False)
        if (key := (tensor, b, rec, len(self._memo))) in self._ranks:  # until another group is solved
            return self._ranks[key]
        best = (0.0, self.batch)
        for (ten, mb, rc), st in self._memo.items():
            if ten == tensor and rc in (rec, False) and (self.batch // mb) % b == 0:
                t = least_time(self, ten, mb, rc, floors=False) or float(np.sum(st.time))  # st's: past budget
                if t * b / (self.batch // mb) > best[0] * b / best[1]:
                    best = (t, self.batch // mb)
        return self._ranks.setdefault(key, best)

    def unit_names(self) -> list[str]:
        paths = {b.nodes[0]: b.path for b in self.blocks}
        out = []
        for k, (a, _) in enumerate(self.spans):
            out.append(paths.get(a, "prologue" if k == 0 else "epilogue" if k == len(self.spans) - 1
                                 else self.graph.nodes[a].name))
        return out

    def price(self, c: Candidate) -> Priced:
        self._names = getattr(self, "_names", None) or self.unit_names()
        return price_fitting(c, self.stats(c), self.cluster, self.capacity, self.optimizer, self.master,
                             self.itemsize, self._names, self.expert_stats(c))

    def degrees(self, context: int | None = None) -> list[Degrees]:
        """The space's degrees: per level tensor x pipeline x data; where the model has causal
        self-attention over its sequence, each of ``contexts`` carved out of the data degrees
        (``with_context``), or only ``context`` when given (a pin's); where it has routed
        experts, each expert degree the data devices allow (``expert_options``)."""
        plain = level_degrees(self.levels, self.max_tensor, max_pipeline=len(self.spans))
        if context is not None and context > 1:
            plain = [x for x in (with_context(d, context) for d in plain) if x is not None]
        elif context is None:
            plain = plain + [x for k in self.contexts for x in (with_context(d, k) for d in plain) if x is not None]
        plain = plain + [dataclasses.replace(d, ring=True) for d in plain if d.c > 1]  # gathers or a ring
        if not self.experts:
            return plain
        return [Degrees(d.tensor, d.pipeline, d.data, expert=ex) if ex else d
                for d in plain for ex in expert_options(d.data, self.experts)]

    def candidates(self, pin: Pin | None, zeros, recomputes, schedules=("1f1b",)
                   ) -> list[tuple[float, float, float, Candidate]]:
        """(compute bound, rest of the bound, memory floor, candidate) of the space or a pin's part;
        pipelined degrees once per schedule of ``schedules`` that has enough units to cut."""
        out = []
        for deg in self.degrees(pin.context if pin is not None and pin.context else None):
            if pin is not None and not pin.admits(deg):
                continue
            if self.batch % deg.d:
                continue
            multi = sum(1 for k in deg.data if k > 1) > 1
            for m in (k for k in divisors(self.batch // deg.d) if self.accumulate in (0, k)):
                if pin is not None and pin.microbatch is not None and self.batch // (deg.d * m) != pin.microbatch:
                    continue
                for z in (zeros if deg.d > 1 else (0,)):
                    for inner in ((False, True) if (multi and z) else (False,)):
                        if pin is not None and pin.zero_inner is not None and z and inner != pin.zero_inner:
                            continue
                        for rc in recomputes:
                            for sched, v in schedule_options(schedules if deg.p > 1 else ("1f1b",), deg.p,
                                                             len(self.spans)):
                                c = Candidate(deg, m, z, inner, rc, sched, v)
                                if not weighed(c, schedules, len(self.spans)):
                                    continue
                                comp, rest, mem = lower_bound(c, self.least, self.cluster, self.peak, self.eff,
                                                              self.optimizer, self.master, self.itemsize)
                                # context: its gathers on top of the compute at peak (each stage's
                                # time is its compute plus them)
                                out.append((comp + c.rounds * self.gathers(c) / deg.p, rest, mem, c))
        return out

    def best(self, pin: Pin | None, zeros, recomputes, deadline: float | None = None, schedules=("1f1b",),
             incumbent: Priced | None = None) -> tuple[Priced | None, Priced | None, int, bool]:
        """(best fitting plan, least-memory plan priced when none fits, candidates priced, closed).

        Branch and bound over ever tighter bounds: a candidate is popped with the bound of its
        level -- 0: compute only; 1: its tensor group's optimum at the whole batch, scaled
        (``reference_bound``); 2: its group's exact unit costs (``stats_bound``) -- and pushed back
        with the next, until at level 3 it is priced. ``closed``: the next bound reached the best
        fitting cost, so that plan is optimal over the space. ``incumbent``: a fitting plan of
        the space already priced (a baseline), the best until one beats it: a search stopped at
        its deadline is never worse than it."""
        cands = self.candidates(pin, zeros, recomputes, schedules)
        heap = [(max(comp, sync_lb(c, self.totals, self.cluster, comp)) + rest, i, 0)
                for i, (comp, rest, mem, c) in enumerate(cands) if early_memory_floor(self, c, mem) <= self.capacity]
        heapq.heapify(heap)
        # per candidate whose memory floor fits, the tightest bound valid under any tensor-group
        # layout (docs/bound.md); their minimum bounds the optimum of the space
        valid = {i: lb for lb, i, _ in heap}
        best, priced, closed = incumbent, 0, True
        while heap:
            lb, i, level = heapq.heappop(heap)
            if best is not None and lb >= best.cost * (1 - 1e-12):
                break
            if deadline is not None and time.process_time() > deadline and best is not None:
                closed = False
                break
            comp, rest, _, c = cands[i]
            try:  # a group whose DP refuses its tables (past its budget) keeps the bound it has
                if level == 0:
                    b = self.batch // (c.degrees.d * c.microbatches)
                    t_ref, b_ref = self.reference(c)
                    # context: 1/c of the work, plus its gathers at this microbatch
                    tight = reference_bound(c, t_ref / c.degrees.c + self.gathers(c) * b_ref / b, b_ref, b, comp, rest)
                    valid[i] = max(valid[i], tight)
                    heapq.heappush(heap, (max(tight, lb), i, 1))
                    continue
                if level == 1:  # the memory floor first: most candidates that reach here fit no layout
                    fits = memory_floor(self, c, cands[i][2]) <= self.capacity
                    valid[i] = max(valid[i], any_layout_bound(self, c, comp, rest, best.cost if best else math.inf)
                                   ) if fits else math.inf
                    if not math.isfinite(valid[i]):
                        del valid[i]  # no layout of its group fits (docs/bound.md): not worth pricing
                        continue
                    tight = stats_bound(c, self.stats(c), self.cluster, self.optimizer, self.master, self.itemsize,
                                        self.expert_stats(c))
                    heapq.heappush(heap, (max(tight, lb, valid[i]), i, 2))
                    continue
                pr = self.price(c)
                priced += 1
                if i in valid and all(len(k) == 1 for k in self.stats(c).tables.configs):
                    if pr.fits:  # its group has one layout: the price is its optimum
                        valid[i] = max(valid[i], pr.cost)
                    else:
                        del valid[i]
                if pr.fits and (best is None or pr.cost < best.cost):
                    best = pr
            except SearchTooLargeError:
                self.refused.add(c)
        if best is not None and pin is None:  # time traded against memory where the floors sit below the plan
            tighten(self, cands, valid, best.cost, deadline)
        self.space_bound = min(valid.values(), default=math.inf)
        self.bounds = {cands[i][3]: v for i, v in valid.items()}  # candidate -> its bound, for the report
        least = None
        if best is None and cands:  # nothing fits: the candidate with the smallest memory floor, as written
            with contextlib.suppress(SearchTooLargeError):
                least = self.price(min(cands, key=lambda x: (x[2], x[0] + x[1]))[3])
        return best, least, priced, closed and best is not None


# -- a Plan from a priced candidate ----------------------------------------------------------------

def plan_hierarchical(graph: Graph, cluster: Cluster, common: dict,
                      training: TrainingSettings = TrainingSettings(), *, pin: Pin | None = None, memory_capacity: float | None = None,
                      time_limit: float = 60.0, solve=None, with_baselines: bool = True,
                      reference: dict | None = None) -> Plan:
    """The best plan of the hierarchical space; baselines: data parallelism with the ZeRO stage,
    recomputation and microbatching that fit it best, and the pinned (published) plan if given."""
    from autopar.planning.degrees import parse_pin
    from autopar.search.dp import dp

    pin = parse_pin(pin)
    solve = solve or (lambda t, g=None: dp(t))
    mode, optimizer, (precision, zero, recompute) = training.mode, training.optimizer, training.choices
    if mode != "train":
        raise ValueError("the hierarchical search plans training (mode='train'); plan inference on "
                         f"at most {FLAT_LIMIT} devices")
    start = time.perf_counter()
    precision = precision or default_precision(cluster)
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    device = float(memory_capacity or cluster.memory_capacity)
    capacity = usable_memory(device)  # what a plan may use: compile refuses more (core/margin.py)
    search = Search(graph, cluster, precision, optimizer, mode, capacity, solve)
    if pin is not None and (pin.expert or 1) > 1 and not search.experts:
        raise ValueError(f"the pin sets expert={pin.expert}, but {graph.model_name or 'the model'} has no routed "
                         "experts (no module named 'experts'): drop expert= from the pin")
    search.accumulate = steps(training.accumulate, search.batch, zero)  # ZeRO 0/1 with it, as on the flat path
    zeros = tuple(z for z in ((0, 1, 2, 3) if zero == "auto" else (int(zero),)) if z <= 1 or search.accumulate <= 1)
    recs = searched_recomputes(recompute, len(search.blocks), search.attention)  # k: every.py
    seeds = []  # the baselines of this space, priced first: the search starts from the best that fits
    if with_baselines:
        seeds.append(search.best(Pin(tensor=1, pipeline=1), zeros, recs)[0])
        if pin is not None:
            seeds.append(search.best(pin, zeros if pin.zero is None else (pin.zero,),
                                     recs if pin.recompute is None else (pin.recompute,),
                                     schedules=pin_schedules(pin))[0])
    seeds = [x for x in seeds if x is not None and x.fits and x.candidate.zero in zeros
             and x.candidate.recompute in recs and x.candidate.degrees.c in (1, *search.contexts)]
    # the search's own CPU seconds (a busy machine does not cut it short), after the baselines,
    # which are priced anyway; every schedule for autopar's plan and a pin's (a pin fixes degrees;
    # its schedule only if it says so)
    deadline = time.process_time() + time_limit
    best, least, priced, closed = search.best(None, zeros, recs, deadline, tuple(SCHEDULES),
                                              min(seeds, key=lambda x: x.cost) if seeds else None)
    common = dict(common, space="hierarchical")
    if best is None:
        need = least.memory / 2**30 if least else math.nan
        raise InfeasibleError(
            f"no plan of {graph.model_name or 'the model'} in the hierarchical space fits "
            f"{max(capacity, 0.0) / 2**30:.3g} GiB per device ({capacity_words(device)}) on {cluster.devices} devices; "
            f"the least found needs {need:.3g} GiB ({least.candidate.describe() if least else '-'}): add devices or memory",
            least.memory if least else math.inf)
    # against the optimum of the space (docs/bound.md); a bound equal to the plan up to rounding is no gap
    gap = max(best.cost / search.space_bound - 1.0, 0.0)
    timed_out = not closed
    info = SearchInfo("hierarchical", time.perf_counter() - start, gap=gap, status="bound",
                      detail=DETAIL + (f"; stopped at the time limit after {priced} candidates" if timed_out else
                                       f"; {priced} candidates priced, {search.solves} tensor-group DPs")
                      + (f"; {len(search.refused)} candidates unpriced, their group's DP past its table budget"
                         " (their first bounds kept)" if search.refused else ""))
    if timed_out:  # the bound still holds: the candidates left keep the bounds they were popped with
        info.detail = "time limit reached before the bound closed; " + DETAIL
    base = {}
    if with_baselines:
        dp_plan = _fixed(search, Pin(tensor=1, pipeline=1), zeros, recs, common,
                         "data parallelism: the ZeRO stage, recomputation and microbatches that fit best")
        if dp_plan is not None:
            base["data_parallel"] = dp_plan
        if pin is not None:
            pinned = _fixed(search, pin, zeros if pin.zero is None else (pin.zero,),
                                       recs if pin.recompute is None else (pin.recompute,), common,
                                       f"pinned {pin.describe()}; the rest searched", reference)
            if pinned is None:
                raise ValueError(f"no plan of the space matches the pin {pin.describe()} on {cluster.devices} "
                                 "devices: the degrees must multiply to the device count and divide the batch, and "
                                     "interleaved 1F1B runs without ZeRO-3")
            base["published"] = pinned
    return to_plan(best, search, common, info, base)


def _fixed(search: Search, pin: Pin, zeros, recs, common, detail: str, reference: dict | None = None
           ) -> Plan | None:
    """The best plan matching ``pin`` (as written, fitting or not), or None when none exists."""
    start = time.perf_counter()
    best, least, _, _ = search.best(pin, zeros, recs, schedules=pin_schedules(pin))
    pr = best or least
    if pr is None:
        return None
    fits = "" if best is not None else "; does not fit the devices' memory"
    info = SearchInfo("pinned", time.perf_counter() - start, status="fixed", detail=detail + fits)
    return to_plan(pr, search, common, info, {}, reference)


__all__ = ["FLAT_LIMIT", "use_hierarchical", "wanted", "plan_hierarchical", "default_precision", "Search"]
