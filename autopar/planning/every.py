"""Recomputing every k-th repeated block on the hierarchical path: blocks 0, k, 2k, ... as
``core.blocks.recomputed_blocks`` picks them on the flat path (and codegen checkpoints them).

A hierarchical candidate's ``recompute`` is then the int k (True: every block; k = 1 is True).
Recomputing a block only adds its forward (and its inputs' forward reshards) and saves its
activations but its inputs, so between none and every block the trade is per block: a sparser k
keeps more memory for less forward run again.

The tensor group's layout is one layout for every unit. Where the group's layouts without and
with full recomputation are the same, it is that one (each unit's best for its own kind, as far
as the units' layouts do not interact through the tensors between them); where they differ, the
exact DP's over the group's graph (or its window, ``core.blocks.block_window``) where each node
costs what it costs in its own block: a recomputed block's nodes as under full recomputation,
the others' as without; a window's middle block, which stands for blocks of both kinds, at the
share of them recomputed (the window's assumption, one layout for every middle block, is kept). Its unit figures are the
group's two pricings under that one layout, each unit taking its own kind's: a recomputed
block's time with its forward again and its inputs kept, the others' time and activations as
without recomputation.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from autopar.core.batch import scale_batch
from autopar.core.blocks import Block
from autopar.core.ir import Graph
from autopar.core.strategy import RECOMPUTE_ATTENTION, RECOMPUTE_POINTWISE, TrainingOptions, node_training
from autopar.core.tables import CostTables, Solution
from autopar.cost_models.memory import already_saved, node_memory
from autopar.planning.units import UnitStats, unit_stats

# the per-unit figures of ``UnitStats``: a unit takes them from its own kind's pricing
PER_UNIT = ("compute", "comm", "sync", "params", "grads", "optimizer", "acts", "full_acts", "numel",
            "sp_acts", "sp_comm", "transient")


def every_of(recompute) -> int:
    """k of a recomputation of every k-th block with k >= 2; 0 for none, every block (True) and
    attention-only."""
    return recompute if type(recompute) is int and recompute >= 2 else 0


def options_of(recompute, **kw) -> TrainingOptions:
    """The ``TrainingOptions`` of a candidate's recomputation (k: ``recompute=True, every=k``)."""
    k = every_of(recompute)
    return TrainingOptions(recompute=True if k else recompute, every=k or 1, **kw)


def every_options(blocks: int, largest: int = 8) -> tuple[int, ...]:
    """The k searched: 2, 4, ... up to ``largest``, each dividing the repeated blocks into equal
    groups of k (each group one recomputed block) with at least two groups."""
    powers = (2 ** j for j in range(1, largest.bit_length()))
    return tuple(k for k in powers if blocks % k == 0 and k < blocks)


NAMED_MODES = (RECOMPUTE_ATTENTION, RECOMPUTE_POINTWISE)  # the recomputations named by a word, not a k


def searched_recomputes(recompute, blocks: int, attention: bool) -> tuple:
    """The recomputations the hierarchical search weighs for ``recompute``: under "auto" none,
    every block, every k-th, pointwise where there are repeated blocks (``core/selective.py``) and
    attention-only where the graph has a core; a named mode or k: that one."""
    if recompute == "auto":
        return ((False, True, *every_options(blocks)) + ((RECOMPUTE_POINTWISE,) if blocks else ())
                + ((RECOMPUTE_ATTENTION,) if attention else ()))
    if recompute in NAMED_MODES:
        return (recompute,)
    return (every_of(recompute) or bool(recompute),)


def reference_mode(recompute):
    """The recomputation whose tensor-group optimum bounds ``recompute``'s from below: none for
    every k-th block and for pointwise recomputation (each runs what none runs, and some forward
    again, under any layout), itself otherwise."""
    return False if every_of(recompute) or recompute == RECOMPUTE_POINTWISE else recompute


def recomputed_units(spans: list[tuple[int, int]], blocks: list[Block], k: int) -> np.ndarray:
    """[U] bools: the units of the blocks every k-th recomputation takes (blocks 0, k, 2k, ...)."""
    first = {b.nodes[0]: j for j, b in enumerate(blocks)}
    return np.asarray([a in first and first[a] % k == 0 for a, _ in spans], dtype=bool)


def recomputed_of(search, recompute) -> np.ndarray:
    """[U] bools: the units of ``search`` (a ``hierarchical.Search``) that ``recompute`` (False,
    True, k) recomputes."""
    if not recompute:
        return np.zeros(len(search.spans), dtype=bool)
    return recomputed_units(search.spans, search.blocks, every_of(recompute) or 1)


def per_unit(search, recompute, each):
    """``each(recompute)``; for every k-th block, per unit: ``each(True)`` on the recomputed units,
    ``each(False)`` on the others (``each`` gives per-unit arrays or ``UnitStats``)."""
    if not every_of(recompute):
        return each(recompute)
    mask, plain, full = recomputed_of(search, recompute), each(False), each(True)
    return mixed(plain, full, mask) if isinstance(full, UnitStats) else np.where(mask, full, plain)


def mixed(plain: UnitStats, full: UnitStats, mask: np.ndarray) -> UnitStats:
    """Per unit, ``full``'s figures where ``mask`` holds and ``plain``'s elsewhere; both priced
    under one layout (the rest, the layout's record, is ``full``'s)."""
    pick = {f: np.where(mask, getattr(full, f), getattr(plain, f)) for f in PER_UNIT
            if getattr(full, f) is not None and getattr(plain, f) is not None}
    return dataclasses.replace(full, **pick, recomputed=np.asarray(mask, dtype=bool))


def _weights(search, k: int) -> np.ndarray:
    """Per node of the group's graph (the window's where there is one): the share of the units
    it stands for that every k-th recomputation recomputes."""
    mask = recomputed_units(search.spans, search.blocks, k)
    win = search.window(True)
    if win is None:
        unit_of = np.empty(search.spans[-1][1], dtype=np.intp)
        for u, (a, b) in enumerate(search.spans):
            unit_of[a:b] = u
        return mask[unit_of].astype(float)
    share = np.zeros(len(win.spans))
    count = np.zeros(len(win.spans))
    np.add.at(share, win.unit_map, mask.astype(float))
    np.add.at(count, win.unit_map, 1.0)
    share = share / np.maximum(count, 1.0)
    out = np.zeros(win.spans[-1][1])
    for w, (a, b) in enumerate(win.spans):
        out[a:b] = share[w]
    return out


def blend(plain: CostTables, full: CostTables, weight: np.ndarray) -> CostTables:
    """The group's tables with each node (and every edge into it) costing ``weight`` of its
    recomputed cost and the rest of its plain one."""
    node_cost = [w * f + (1.0 - w) * p for w, f, p in zip(weight, full.node_cost, plain.node_cost)]
    edges = {e: weight[e[1]] * full.edge_cost[e] + (1.0 - weight[e[1]]) * m
             for e, m in plain.edge_cost.items()}
    return CostTables(plain.nodes, plain.configs, node_cost, edges, plain.memory, math.inf, plain.units)


def every_stats(search, tensor: tuple[int, int], microbatches: int, k: int) -> UnitStats:
    """``UnitStats`` of every k-th block recomputed for one tensor group at one microbatch
    (``search``: a ``hierarchical.Search``): the blended DP's layout, each unit priced as its kind."""
    plain = search._stats(tensor, microbatches, False)
    full = search._stats(tensor, microbatches, True)
    if len(plain.choice) != len(full.choice) or any(len(a) != len(b) for a, b in
                                                    zip(plain.tables.configs, full.tables.configs)):
        raise ValueError("every k-th block recomputed: the group's graph has other configs "
                         "with recomputation")
    choice = list(full.choice)
    if choice != list(plain.choice):  # the two kinds' layouts differ: the blended DP picks one
        search.solves += 1
        choice = list(search.solve(blend(plain.tables, full.tables, _weights(search, k)), full.graph).choice)

    def under(rc: bool, solved: UnitStats) -> UnitStats:
        if list(solved.choice) == choice:
            return solved
        fixed = Solution(choice, 0.0, 0.0, "fixed", 0.0)
        return unit_stats(search.training_graph(rc), search.spans, search.cluster, tensor, microbatches,
                          search.objective, lambda t, g=None: fixed, search.mode, search.optimizer,
                          search.window(rc), tables=solved.tables)  # the same tables, another layout

    mask = recomputed_units(search.spans, search.blocks, k)
    out = mixed(under(False, plain), under(True, full), mask)
    memo = search.__dict__.setdefault("every_graphs", {})  # (k, microbatches) -> graph, already_saved
    if (k, microbatches) not in memo:
        g = scale_batch(search.training_graph(k), microbatches)
        memo[(k, microbatches)] = (g, already_saved(g))
    counted = saved(*memo[(k, microbatches)], search.spans, out, search.mode, search.optimizer)
    return dataclasses.replace(out, **counted)


def saved(g: Graph, dup: dict, spans: list[tuple[int, int]], s: UnitStats, mode: str,
          optimizer: str | None) -> dict[str, np.ndarray]:
    """Per unit, the activations (``acts``, and ``full_acts`` without recomputation) of
    ``g`` (every k-th block recomputed, at the microbatch; ``dup``: its ``already_saved``) under
    ``s``'s layout, counted on the graph itself: a
    tensor a recomputed block keeps as its input and a later block reads too (the attention mask
    every block reads) is counted in each, as autograd keeps it (``cost_models.memory``)."""
    mesh = s.cluster.mesh()
    node_map = s.node_map if s.node_map is not None else range(len(g.nodes))
    acts, full = np.zeros(len(spans)), np.zeros(len(spans))
    cache: dict[tuple, tuple[float, float]] = {}
    for u, (a, b) in enumerate(spans):
        for i in range(a, b):
            node, w = g.nodes[i], node_map[i]
            shared = dup.get(node.name, frozenset())
            rec = node_training(node)
            key = (w, shared, rec.recompute, rec.saved_inputs)
            if key not in cache:
                cfg = s.tables.configs[w][s.choice[w]]
                kept = node_memory(node, cfg, mesh, mode, optimizer, shared=shared).activations
                kept_all = dataclasses.replace(rec, recompute=False)
                plain = dataclasses.replace(node, attrs={**node.attrs, "train": kept_all})
                cache[key] = (kept, node_memory(plain, cfg, mesh, mode, optimizer, shared=shared).activations
                              if rec.recompute else kept)
            acts[u] += cache[key][0]
            full[u] += cache[key][1]
    return {"acts": acts, "full_acts": full}


__all__ = ["every_of", "options_of", "every_options", "searched_recomputes", "reference_mode", "NAMED_MODES",
           "recomputed_units", "recomputed_of", "per_unit", "mixed", "blend", "every_stats", "saved"]
