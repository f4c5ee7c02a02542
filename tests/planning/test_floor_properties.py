"""Every floor the hierarchical search certifies its gap with is at most the exact price of every
layout it bounds (docs/bound.md): on random small chains and residual stacks, random clusters and
capacities, every candidate of the space (tensor x pipeline x data degrees, microbatches, ZeRO 0-3,
recomputation, every schedule) whose tensor group is small enough is priced under every layout of
its group (the middle blocks one layout, as the search prices them): the least time of any layout
the floors divide (``least_time``) equals the brute-force least, and each floor -- the first
bound, the reference bound, the balanced, whole-unit, capped and cut floors, ``any_layout_bound``,
the Lagrangian bound, the memory floor and the bound the search itself keeps per candidate -- is
compared with the brute-force least price (or least fitting price, for the floors that use the
capacity)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import autopar
from autopar.core.cluster import Cluster
from autopar.core.margin import usable_memory
from autopar.planning import hierarchical as H
from autopar.planning.lagrangian import lagrangian_bound
from autopar.planning.early_memory import early_memory_floor
from autopar.planning.least_time import least_time, node_floor
from autopar.planning.space_bound import (accumulation_floor, any_layout_bound, balanced, capped_bound,
                                          cut_bound, held_bound, memory_floor)
from autopar.planning.step_bounds import layout_bound, reference_bound, sync_lb
from autopar.search.dp import dp
from tests.helpers.layouts import SCHEDULES, ZEROS, Residual, priced, window_layouts
from tests.planning.test_space_bound import Chain

TOL = 1 + 1e-9
MOST_LAYOUTS = 64  # per tensor group: its layouts are all priced


class Narrow(nn.Module):
    """Blocks that narrow and widen again (width -> width/2 -> width): the stages' cuts differ."""

    def __init__(self, width=16, blocks=2):
        super().__init__()
        self.down = nn.ModuleList(nn.Linear(width, width // 2) for _ in range(blocks))
        self.up = nn.ModuleList(nn.Linear(width // 2, width) for _ in range(blocks))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        for d, u in zip(self.down, self.up):
            x = x + u(torch.relu(d(x)))
        return self.head(x).square().mean()


MODELS = {"chain": Chain, "residual": Residual, "narrow": Narrow}


def _layouts_of(search, group: tuple) -> int:
    return math.prod(len(k) for k in search._stats(*group).tables.configs)


def _check(kind: str, blocks: int, width: int, shape: tuple, devices: int, recomputes: tuple, share: float,
           pick: list[int]) -> None:
    cluster = Cluster.preset(f"{devices}xA100")
    model = MODELS[kind](width, blocks).to("meta")
    g = autopar.trace(model, (torch.empty(*shape, width, device="meta"),))
    search = H.Search(g, cluster, "bf16", "adam", "train", usable_memory(cluster.memory_capacity),
                      lambda t, g=None: dp(t))
    cands = search.candidates(None, ZEROS, recomputes, SCHEDULES)
    small = [x for x in cands if _layouts_of(search, search.group_key(x[3])) <= MOST_LAYOUTS]
    chosen = [small[k % len(small)] for k in pick]
    chosen = list({x[3]: x for x in chosen}.values())
    every = window_layouts(search, chosen, cluster)
    memory = sorted(priced(search, s, c, cluster).memory for s, c in every)
    search.capacity = memory[min(int(len(memory) * share), len(memory) - 1)]
    least, best, least_mem, least_t = {}, {}, {}, {}
    for s, c in every:
        key = search.group_key(c)
        least_t[key] = min(least_t.get(key, math.inf), float(np.sum(s.time)))
        plain = priced(search, s, c, cluster)
        least[c] = min(least.get(c, math.inf), plain.cost)
        least_mem[c] = min(least_mem.get(c, math.inf), plain.memory)
        pr = priced(search, s, c, cluster, fitting=True)
        if pr.fits:
            best[c] = min(best.get(c, math.inf), pr.cost)
    for _, _, _, c in cands:  # every group solved, so that the reference bound reads them all
        search.stats(c)
    for key, t in least_t.items():  # the least time of any layout, solved: the brute-force least
        assert least_time(search, *key) == pytest.approx(t, rel=1e-9), key
        assert node_floor(search, *key) <= t * TOL, key  # the cheap floor the search tries first
    for comp, rest, static, c in chosen:
        name = c.describe()
        # floors that hold for every layout, fitting or not
        assert max(comp, sync_lb(c, search.totals, search.cluster, comp)) + rest <= least[c] * TOL, name
        t_ref, b_ref = search.reference(c)
        b = search.batch // (c.degrees.d * c.microbatches)
        ref = reference_bound(c, t_ref / c.degrees.c + search.gathers(c) * b_ref / b, b_ref, b, comp, rest)
        assert ref <= least[c] * TOL, name
        added = float(np.sum(accumulation_floor(search, c)))
        assert layout_bound(c, balanced(search, c), cluster, comp, rest, added) <= least[c] * TOL, name
        assert layout_bound(c, balanced(search, c, exact=False), cluster, comp, rest, added) <= least[c] * TOL, name
        assert held_bound(search, c) + rest <= least[c] * TOL, name
        assert memory_floor(search, c, static) <= least_mem[c] * TOL, name
        assert early_memory_floor(search, c, static) <= least_mem[c] * TOL, name
        if c not in best:
            continue
        # floors that use the capacity: at most the best layout that fits, plain or sequence parallel
        assert memory_floor(search, c, static) <= search.capacity * TOL, name
        assert capped_bound(search, c) + rest <= best[c] * TOL, name
        assert cut_bound(search, c, rest) <= best[c] * TOL, name
        assert any_layout_bound(search, c, comp, rest) <= best[c] * TOL, name
        assert lagrangian_bound(search, c, comp, rest, static) <= best[c] * TOL, name
    # the bound the search keeps per candidate, the space's bound their least
    search.floors.clear()
    search.best(None, ZEROS, recomputes, schedules=SCHEDULES)
    for c, cost in best.items():
        assert search.bounds.get(c, math.inf) <= cost * TOL, c.describe()


@settings(max_examples=24, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(sorted(MODELS)), blocks=st.integers(2, 5), width=st.sampled_from([8, 16]),
       shape=st.sampled_from([(2,), (4,), (4, 8)]), devices=st.sampled_from([2, 4]),
       recomputes=st.sampled_from([(False,), (True,), (False, True)]),
       share=st.sampled_from([1.0, 0.5, 0.2, 0.0]),
       pick=st.lists(st.integers(0, 10_000), min_size=1, max_size=4))
def test_every_floor_is_below_every_layouts_price(kind, blocks, width, shape, devices, recomputes, share,
                                                   pick):
    _check(kind, blocks, width, shape, devices, recomputes, share, pick)


def test_a_chain_whose_middle_blocks_take_their_inputs_split_is_not_priced_below_the_floors():
    """Eight linear blocks, tensor 2 x pipeline 2 on 4 A100s, one microbatch: a layout whose first
    block splits its outputs and whose middle blocks take them split (the middle block's input
    edge free in the window) is the cheapest the search prices, cheaper than the group's own
    layout; the balanced floor from the group's layout read above it."""
    _check("chain", 8, 16, (4,), 4, (False,), 1.0, list(range(200)))
