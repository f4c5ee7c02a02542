"""One strategy priced by both planning paths, term by term.

The hierarchical search prices a pinned strategy (``autopar.plan(..., pin=...)``: its "published"
baseline, the degrees, ZeRO stage, recomputation and microbatch size as pinned); the flat path
prices the same per-node layout on its own tables (``planning/options.FlatOptions`` under the
same training options, the hierarchical plan's configs mapped onto the flat mesh). Each side's
terms are read from what that side priced: the hierarchical plan's ``time_terms`` and
``memory_terms``, the flat plan's per-node rows (``breakdown.mesh_rows``) and per-node memory
(``cost_models.memory.node_memory``), so a test compares the two models, not a copy of either.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from dataclasses import dataclass, field

import autopar
from autopar.core.strategy import TrainingOptions
from autopar.cost_models.memory import already_saved, node_memory
from autopar.planning import registry
from autopar.planning.breakdown import mesh_rows
from autopar.core.blocks import apply_training
from autopar.cost_models.tables import build_tables, update_memory

PRECISION = "bf16"


@dataclass
class Priced:
    cost: float  # seconds per step
    memory: float  # peak bytes per device
    time: dict[str, float] = field(default_factory=dict)
    memory_terms: dict[str, float] = field(default_factory=dict)


def hierarchical(model, inputs, cluster, tensor: int, data: int, zero: int, recompute: bool, batch: int):
    """The hierarchical path's plan of the pinned strategy: one microbatch of ``batch / data``
    sequences a step (``batch``: the example's), one stage."""
    pin = (f"tensor={tensor},pipeline=1,data={data},zero={zero},recompute={int(recompute)},"
           f"microbatch={batch // data}")
    plan = autopar.plan(model, inputs, cluster, hierarchical=True, pin=pin, zero=zero, recompute=recompute,
                        precision=PRECISION).baselines["published"]
    assert plan.microbatches == 1 and plan.strategy.degrees.p == 1, plan.search.detail
    return plan


def hierarchical_terms(plan) -> Priced:
    return Priced(plan.cost, plan.memory_per_device, dict(plan.strategy.time_terms),
                  dict(plan.strategy.memory_terms))


def _axis_maps(src_shape, dst_shape):
    """Each axis of ``src_shape`` -> consecutive axes of ``dst_shape`` with its size, the
    destination axes taken in every order (equal axes of one level are interchangeable, and the
    flat space keeps one of each such pair of configs)."""
    for order in itertools.permutations(range(len(dst_shape))):
        out, j = {}, 0
        for i, size in enumerate(src_shape):
            axes, prod = [], 1
            while prod < size and j < len(order):
                axes.append(order[j])
                prod *= dst_shape[order[j]]
                j += 1
            if prod != size:
                break
            out[i] = tuple(axes)
        else:
            yield out


def _renamed(cfg, amap):
    """``cfg`` with its mesh axes renamed by ``amap`` (a source axis -> destination axes)."""
    axes = tuple(tuple(b for a in ax for b in amap[a]) for ax in (cfg.mesh_axes or ((),) * len(cfg.splits)))
    return dataclasses.replace(cfg, mesh_axes=axes)


def flat_terms(hier_plan, cluster, zero: int, recompute: bool) -> Priced:
    """The flat path's price of ``hier_plan``'s per-node layout, under the same options: the flat
    tables (``cost_models.tables.build_tables``, the flat search's cost model) built over a space
    of one config per node, the plan's, so the sum of their costs is the flat model's price."""
    opts = TrainingOptions(zero, PRECISION, recompute)
    g = apply_training(hier_plan.graph, opts)
    model = registry.cost_model("analytic").make(g, cluster, "train", "adam")
    amap = next(_axis_maps(hier_plan.mesh.shape, cluster.mesh().shape))
    assignment = {name: _renamed(c, amap) for name, c in hier_plan.assignment.items()}
    t = build_tables(g, cluster, model, space=lambda node, mesh: [assignment[node.name]], mode="train",
                     optimizer="adam")
    choice = [0] * len(t.nodes)
    assignment = {name: t.configs[i][0] for i, name in enumerate(t.nodes)}
    cost = sum(float(t.node_cost[i][0]) for i in range(len(choice)))
    cost += sum(float(m[0, 0]) for m in t.edge_cost.values())
    update = update_memory(g, t, cluster, "adam")
    backward = t.total_memory(choice)
    peak = backward if update is None else max(backward, sum(float(u[0]) for u in update))
    time = collections.Counter()
    for row in mesh_rows(g, t, assignment, model, cluster, "train"):
        for term in row.terms:
            time[term.kind] += term.seconds
    mem = collections.Counter()
    dup, seen = already_saved(g), set()
    mesh = cluster.mesh()
    for node in g.nodes:
        skip = frozenset(p.source for p in node.params if p.source in seen)
        mb = node_memory(node, assignment[node.name], mesh, "train", "adam", skip,
                         shared=dup.get(node.name, frozenset()))
        seen.update(p.source for p in node.params)
        for k in ("params", "grads", "optimizer", "activations", "transient"):
            mem[k] += getattr(mb, k)
    return Priced(cost, peak, dict(time), dict(mem))
