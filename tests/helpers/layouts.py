"""A graph small enough to price every candidate of the hierarchical space under every layout of
its tensor group: the brute force the bound tests (tests/planning/test_space_bound.py,
test_relaxed_bound.py) compare the search's lower bounds with."""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn as nn

import autopar
from autopar.core.cluster import Cluster
from autopar.core.margin import usable_memory
from autopar.core.tables import Solution
from autopar.planning import hierarchical as H
from autopar.planning.activations import price_fitting
from autopar.planning.units import unit_stats
from autopar.search.dp import dp

CLUSTER = Cluster.preset("2xA100")  # one level of 2: tensor x pipeline x data in {1, 2}
ZEROS = (0, 1, 2, 3)
SCHEDULES = tuple(H.SCHEDULES)


class Residual(nn.Module):
    def __init__(self, width=16, blocks=2):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(blocks))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return self.head(x).square().mean()


def every_layout(recomputes: tuple) -> tuple:
    """A batch of 4 (1, 2 or 4 microbatches) under ``recomputes``: the search, its candidates and,
    per candidate, every layout of its tensor group as ``(UnitStats, candidate)``."""
    g = autopar.trace(Residual().to("meta"), (torch.empty(4, 16, device="meta"),))
    search = H.Search(g, CLUSTER, "bf16", "adam", "train", usable_memory(CLUSTER.memory_capacity),
                      lambda t, g=None: dp(t))
    cands = search.candidates(None, ZEROS, recomputes, SCHEDULES)
    groups: dict[tuple, list] = {}
    for _, _, _, c in cands:
        groups.setdefault(search.group_key(c), []).append(c)
    out = []
    for (tensor, micro, rc), members in groups.items():
        graph = search.training_graph(rc)
        sizes = [len(k) for k in search._stats(tensor, micro, rc).tables.configs]
        for choice in itertools.product(*(range(k) for k in sizes)):
            fixed = lambda t, _g=None, ch=list(choice): Solution(ch, 0.0, 0.0, "fixed", 0.0)  # noqa: E731
            s = unit_stats(graph, search.spans, CLUSTER, tensor, micro, search.objective, fixed, "train", "adam")
            out += [(s, c) for c in members]
    return search, cands, out


def window_layouts(search, cands, cluster) -> list:
    """Per candidate of ``cands``, every layout of its tensor group with the search's window (the
    middle blocks one layout), as ``(UnitStats, candidate)``."""
    out = []
    for _, _, _, c in cands:
        tensor, micro, rc = search.group_key(c)
        sizes = [len(k) for k in search._stats(tensor, micro, rc).tables.configs]
        for choice in itertools.product(*(range(k) for k in sizes)):
            fixed = lambda t, _g=None, ch=list(choice): Solution(ch, 0.0, 0.0, "fixed", 0.0)  # noqa: E731
            s = unit_stats(search.training_graph(rc), search.spans, cluster, tensor, micro, search.objective,
                           fixed, "train", "adam", search.window(rc))
            out.append((s, c))
    return out


def priced(search, s, c, cluster=CLUSTER, fitting: bool = False):
    """``c`` under the layout of ``s`` as the search prices a plan (``Search.price``: its units
    named, so ZeRO-3's whole root units count), plain or, ``fitting``, under sequence parallelism
    where the plain one does not fit (``price_fitting``)."""
    how = price_fitting if fitting else H.price
    return how(c, s, cluster, search.capacity, "adam", search.master, search.itemsize, search.unit_names())


def best_fitting(search, every) -> dict:
    """Per candidate, its best fitting price over every layout as the search prices one: its plain
    layout or, where that does not fit, under sequence parallelism (``price_fitting``)."""
    best = {}
    for s, c in every:
        pr = priced(search, s, c, fitting=True)
        if pr.fits:
            best[c] = min(best.get(c, math.inf), pr.cost)
    return best
