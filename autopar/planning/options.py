"""Training options on the flat path: precision as asked (by default the devices' fastest mixed
precision, ``core.strategy.default_precision``, as on the hierarchical path), ZeRO and recomputation when memory binds.

The flat exact search prices one graph at a time, so the options are global: each option set is
the graph under ``core.blocks.apply_training``, its own tables and its own exact search. The
rule: a set is searched unless a set that dominates it in time (``dominators``: the same without
recomputation, the ZeRO stage below) has a best plan that memory does not bind (its best fitting
plan is the best plan ignoring memory), which the dominated set cannot beat. So the plain set and
ZeRO-1 (which can be faster: the optimizer steps a 1/d shard) are always searched, ZeRO-2/3 and
recomputation only when memory binds; the fastest plan that fits wins (ties: the fewest
features, in the order tried). Each search is exact, so the result is exact over every option set.

The data-parallel baseline gets the same treatment: when plain data parallelism does not fit,
it is priced with the first ZeRO stage / recomputation that makes it fit (FSDP-style data
parallelism), so "data parallelism does not fit" is never a straw man.

A plan's memory is the larger of its backward's peak (the tables' memory: activations saved) and
its optimizer update's (the activations freed; the update's working set held: torch's foreach Adam's
square-root buffer, ``cost_models.tables.update_memory``), as the hierarchical pricing takes it. The
search is constrained by the backward's; a set's plan whose update does not fit is searched again
against each node's larger of the two (``FlatOptions._fitted``), its gap measured from the first.

Not in the flat model's memory, stated in the plan's notes: the transient of a recomputed block
during its backward (the hierarchical search counts it). ZeRO-3's gathered parameters (the
root's and two blocks', ``cost_models/zero3.py``) are added to a plan's total, as the
hierarchical search adds them.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

import numpy as np

from autopar.core.batch import batch_dims
from autopar.core.blocks import apply_training, recomputed_blocks
from autopar.core.cost_model import CostModel
from autopar.core.errors import InfeasibleError
from autopar.core.ir import Graph
from autopar.core.margin import usable_memory
from autopar.core.strategy import (RECOMPUTE_ATTENTION, RECOMPUTE_POINTWISE, Strategy, TrainingOptions,
                                   default_precision)
from autopar.core.tables import CostTables, Solution
from autopar.planning.accumulation import STEPS, accumulated_tables, microbatch_graph

NOTE = "memory leaves out the transients of recomputed blocks (flat path)"


def option_sets(precision: str | None, zero, recompute, cluster=None, mode: str = "train",
                accumulate="auto") -> list[TrainingOptions]:
    """Plain first, then by ZeRO stage, then with recomputation, then with gradient accumulation
    (``accumulate``: "auto" adds 2 and 4 microbatches a step; an int k: every set takes k). ``precision`` None: training
    takes ``core.strategy.default_precision(cluster)`` (the rule the hierarchical path uses),
    inference and a call without a cluster fp32."""
    if precision is None:
        precision = default_precision(cluster) if (cluster is not None and mode == "train") else "fp32"
    zs = [0, 1, 2, 3] if zero == "auto" else [int(zero)]
    # recomputation: none, then every 4th, every 2nd, every block (each more memory saved for
    # more forward run again); ``recompute`` True is every block, an int k every k-th
    # ``recompute`` "attention": each attention core only (core/attention_core.py), searched
    # after none: it saves the scores (seq^2 per head) for their forward again
    # ``recompute`` "pointwise": every block's pointwise ops (core/selective.py), after attention:
    # the block's matmul and attention outputs kept, the norms' and activations' run again
    rcs = ([(False, 1), (RECOMPUTE_ATTENTION, 1), (RECOMPUTE_POINTWISE, 1)] + [(True, k) for k in SPARSE]
           + [(True, 1)] if recompute == "auto"
           else [(recompute, 1)] if recompute in (RECOMPUTE_ATTENTION, RECOMPUTE_POINTWISE)
           else [(bool(recompute), max(1, int(recompute)))])
    out = [TrainingOptions(z, precision, rc, k) for rc, k in rcs for z in zs]
    if mode != "train" or accumulate in (1, "1"):
        return out
    if accumulate == "auto":  # gradient accumulation (``accumulation.py``): ZeRO 0/1, the first
        rc, every = rcs[0]  # recomputation (none unless asked for), last in order
        return out + [TrainingOptions(z, precision, rc, every, k) for k in STEPS for z in zs if z <= 1]
    steps = int(accumulate)
    if steps < 1 or not any(z <= 1 for z in zs):
        raise ValueError(f"accumulate={accumulate!r}: gradient accumulation takes a count of microbatches "
                         ">= 1 and runs with ZeRO 0 or 1 (zero=0, 1 or 'auto')")
    return [dataclasses.replace(o, accumulate=steps) for o in out if o.zero <= 1]


SPARSE = (4, 2)  # every k-th block recomputed, the sparsest first
MIN_SLICE = 1.0  # seconds: the least solver time a set gets when the shared limit has run out


def dominators(opts: TrainingOptions) -> list[TrainingOptions]:
    """The option sets no slower than ``opts`` on every config, whose plans need more memory:
    the same with sparser recomputation (recomputing a block only adds its forward: every block
    is dominated by every 2nd, that by every 4th, that by none), and for ZeRO-2/3 the stage below
    (ZeRO-2 moves ZeRO-1's bytes, once per microbatch; ZeRO-3 adds the parameter gathers). So
    where memory does not bind a dominator's best plan, ``opts`` cannot beat it. ZeRO-1 has none:
    it moves plain data parallelism's bytes and steps the optimizer on a 1/d shard, so it can be
    faster without any memory pressure. Gradient accumulation over k microbatches is dominated by
    the next fewer: it runs the same nodes on smaller batches more often, which the cost models
    price at no less time (compute and bytes scale with the batch, each call adds its latency),
    and syncs as often."""
    out = []
    if opts.accumulate > 1:  # half the microbatches (each a step's sync, one larger batch's compute)
        out.append(dataclasses.replace(opts, accumulate=max(s for s in (1,) + STEPS if s < opts.accumulate)))
    if opts.recompute in (RECOMPUTE_ATTENTION, RECOMPUTE_POINTWISE):  # some forward again, nothing less
        out.append(dataclasses.replace(opts, recompute=False))
    elif opts.recompute:  # the next sparser recomputation (every 2k-th block, or none)
        sparser = [k for k in SPARSE if k > opts.every and k % opts.every == 0]
        out.append(TrainingOptions(opts.zero, opts.precision, True, min(sparser)) if sparser
                   else TrainingOptions(opts.zero, opts.precision, False))
    if opts.zero >= 2:
        out.append(TrainingOptions(opts.zero - 1, opts.precision, opts.recompute, opts.every))
    return out


@dataclass
class FlatOptions:
    graph: Graph
    cluster: object
    model: CostModel
    mode: str
    optimizer: str | None
    capacity: float | None
    sets: list[TrainingOptions]
    _tables: dict = field(default_factory=dict)
    _updates: dict = field(default_factory=dict)  # per set: ``update_for``'s vectors
    # after ``solve``: whether memory binds the plain set (its fastest plan does not fit), where
    # the fastest fitting plan may lie outside the flat space (``planning/fallback.py``)
    binds: bool = False

    def graph_for(self, opts: TrainingOptions) -> Graph:
        return self.tables_for(opts)[0]

    def tables_for(self, opts: TrainingOptions) -> tuple[Graph, CostTables]:
        if opts not in self._tables:
            from autopar.cost_models.tables import build_tables

            micro = microbatch_graph(self.graph, opts.accumulate) if opts.accumulate > 1 else self.graph
            if micro is None:
                raise ValueError(f"the batch does not split into {opts.accumulate} microbatches")
            g = apply_training(micro, opts)
            t = build_tables(g, self.cluster, self.model, space="mesh", mode=self.mode, optimizer=self.optimizer)
            if opts.accumulate > 1:
                t = accumulated_tables(g, t, opts.accumulate, self.model, self.cluster, self.mode)
            # plans are searched against what a plan may use: the device's memory (an explicit
            # ``capacity`` or the cluster's) less the margin of core/margin.py that compile enforces
            t.memory_capacity = usable_memory(t.memory_capacity if self.capacity is None else self.capacity)
            if opts.zero >= 3:  # what ZeRO-3 holds whole beside the tables' sum, at its least (``zero3.py``)
                from autopar.cost_models.zero3 import least_gathered

                t.memory_capacity -= least_gathered(g, t, self.cluster.mesh())
            self._tables[opts] = (g, t)
        return self._tables[opts]

    def update_for(self, opts: TrainingOptions) -> list | None:
        """Per node and config, what a device holds through the optimizer's update
        (``cost_models.tables.update_memory``); None where the backward's memory is the peak."""
        if self.mode != "train":
            return None
        if opts not in self._updates:
            from autopar.cost_models.tables import update_memory

            g, t = self.tables_for(opts)
            self._updates[opts] = update_memory(g, t, self.cluster, self.optimizer)
        return self._updates[opts]

    def peak(self, opts: TrainingOptions, choice) -> float:
        """A plan's peak bytes per device: the larger of its backward's (``tables.memory``) and its
        optimizer update's (``update_for``), as the hierarchical pricing takes them (``step_price``)."""
        t, update = self.tables_for(opts)[1], self.update_for(opts)
        backward = t.total_memory(choice)
        return backward if update is None else max(backward, sum(float(u[c]) for u, c in zip(update, choice)))

    def _fitted(self, opts: TrainingOptions, sol: Solution, run) -> Solution:
        """``sol`` (searched against the backward's memory) where its update's peak fits too: then it
        is the optimum under both. Otherwise the set searched again against each node's larger
        of the two (a sum no less than either peak, so what it finds fits), its gap measured from
        the first search's bound, which holds for both."""
        t = self.tables_for(opts)[1]
        update = self.update_for(opts)
        if update is None or self.peak(opts, sol.choice) <= t.memory_capacity:
            return sol
        both = CostTables(t.nodes, t.configs, t.node_cost, t.edge_cost,
                          [np.maximum(b, u) for b, u in zip(t.memory, update)], t.memory_capacity, t.units)
        out = run(both)
        bound = sol.cost / (1 + sol.gap) if math.isfinite(sol.gap) else -math.inf
        out.gap = max(out.gap, out.cost / bound - 1) if bound > 0 else math.inf
        return out

    def solve(self, run, time_limit: float = 60.0) -> tuple[TrainingOptions, Graph, CostTables, Solution]:
        """The fastest plan that fits over the option sets, by the rule of the module docstring;
        InfeasibleError (from the plain tables) when none fits. ``run(tables, seconds)``: the
        search, with its solver's time limit. The sets share ``time_limit``: each search gets the
        time left over the sets left (at least ``MIN_SLICE``). A memory-bound set's DP hands the gap
        its Lagrangian bound leaves to the ILP for as long as it is given: with the whole limit per
        set, 24 default sets of a 4-layer Llama on 8 GPUs took 20 minutes. A search cut short says
        so in its gap."""
        best, error = None, None
        slack: dict[TrainingOptions, bool] = {}  # searched or skipped: True where memory does not bind it
        deadline = time.perf_counter() + time_limit
        for i, opts in enumerate(self.sets):
            limit = max((deadline - time.perf_counter()) / (len(self.sets) - i), MIN_SLICE)
            if any(slack.get(d, False) for d in dominators(opts)):
                slack[opts] = True  # no faster than a set whose best plan memory does not bind
                continue
            try:
                g, t = self.tables_for(opts)
            except ValueError:  # a batch that does not split into the set's microbatches
                slack[opts] = False
                continue
            try:
                sol = self._fitted(opts, run(t, limit), lambda tables: run(tables, limit))
                self._gathered_fit(opts, g, t, sol)
            except InfeasibleError as e:
                error = error or e
                slack[opts] = False
                continue
            slack[opts] = not self._binding(t, sol, lambda free: run(free, limit))
            if best is None or sol.cost < best[3].cost * (1 - 1e-12):
                if best is not None:
                    self._forget(best[0])
                best = (opts, g, t, sol)
            else:
                self._forget(opts)
        self.binds = not slack.get(self.sets[0], True)
        if best is None:
            raise error
        return best

    def _gathered_fit(self, opts: TrainingOptions, g: Graph, t: CostTables, sol: Solution) -> None:
        """ZeRO-3: the plan's gathered parameters above their least (taken off the capacity) fit too."""
        if opts.zero < 3 or not math.isfinite(t.memory_capacity):
            return
        from autopar.cost_models.zero3 import gathered, least_gathered

        mesh = self.cluster.mesh()
        over = t.total_memory(sol.choice) + gathered(g, t, sol.choice, mesh) - least_gathered(g, t, mesh)
        if over > t.memory_capacity:
            raise InfeasibleError(f"the ZeRO-3 plan's gathered parameters do not fit ({over:.4g} bytes)", over)

    def _forget(self, opts: TrainingOptions) -> None:
        """Drop a beaten set's tables (the plain set's stay: the pipeline search and the report
        read them): a set's tables on a large mesh are gigabytes, and without this every set
        searched stayed in memory to the end."""
        if opts != self.sets[0]:
            self._tables.pop(opts, None)
            self._updates.pop(opts, None)

    @staticmethod
    def _binding(tables: CostTables, sol: Solution, run) -> bool:
        """Does memory bind: is the best plan ignoring memory faster than the best that fits?
        The search's own ``free_cost`` answers it when it has one (the DP does: its first solve
        ignores memory); otherwise the tables are searched again without the capacity."""
        if not math.isfinite(tables.memory_capacity):
            return False
        if sol.free_cost is not None:
            return sol.free_cost < sol.cost * (1 - 1e-9)
        free = CostTables(tables.nodes, tables.configs, tables.node_cost, tables.edge_cost, tables.memory,
                          math.inf, tables.units)
        return run(free).cost < sol.cost * (1 - 1e-9)

    def fitting_data_parallel(self, choice_of) -> tuple[TrainingOptions, Graph, CostTables, list[int]]:
        """Data parallelism under the first option set it fits (as written under the last if none):
        ``choice_of(graph, tables)`` gives its configs."""
        out = None
        for opts in self.sets:
            try:
                g, t = self.tables_for(opts)
            except ValueError:
                continue
            choice = choice_of(g, t)
            out = (opts, g, t, choice)
            if self.peak(opts, choice) <= t.memory_capacity:
                break
        return out


def strategy_of(graph: Graph, opts: TrainingOptions, assignment: dict) -> Strategy:
    """The plan's record: ZeRO over the mesh axes that split some node's batch (each parameter
    shards over those of its own node that its gradient is partial along), the recomputed blocks."""
    batch = batch_dims(graph)
    axes: set[int] = set()
    for node in graph.nodes:
        b = batch.get(node.name)
        cfg = assignment.get(node.name)
        if b is not None and cfg is not None and cfg.mesh_axes:
            axes.update(cfg.mesh_axes[[d.name for d in node.dims].index(b)])
    notes = [NOTE] if opts.recompute else []
    return Strategy(options=opts, zero_axes=tuple(sorted(axes)) if opts.zero else (),
                    recompute=recomputed_blocks(graph, opts),
                    notes=notes)
