"""Cheap upper bounds for the memory-limited DP: repair a plan into the limit, then descend.

These never claim optimality; they only lower the best feasible cost the Lagrangian loop has, so
the gap it reports (against its proven lower bound) is smaller. One move changes one node's
config, given its neighbours' configs, to the cheapest one that keeps the plan within memory.
"""

from __future__ import annotations

import numpy as np

from .common import Problem


def _local_cost(p: Problem, nbrs, choice: list[int], i: int) -> np.ndarray:
    """Cost of each config of node i with every other node fixed (its node cost + its edges)."""
    vec = p.node_cost[i].copy()
    for w, rows in nbrs[i]:
        vec += rows[choice[w]]
    return vec


def neighbours(p: Problem) -> list[list[tuple[int, np.ndarray]]]:
    """Per node, (neighbour w, matrix indexed [config of w, config of the node]), row-contiguous."""
    nbrs: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(p.n)]
    for (u, v), mat in p.edges.items():
        nbrs[u].append((v, np.ascontiguousarray(mat.T)))
        nbrs[v].append((u, mat))
    return nbrs


def repair(p: Problem, choice: list[int], nbrs=None) -> list[int] | None:
    """Move one node at a time to the config with the least cost added per byte saved, until the
    plan fits; None if no move saves memory any more. A move only changes the best move of the
    node and its neighbours, so only those are re-scored."""
    nbrs = nbrs or neighbours(p)
    choice = list(choice)
    mem = sum(float(m[c]) for m, c in zip(p.memory, choice))

    def best_move(i: int) -> tuple[float, int]:
        with np.errstate(invalid="ignore"):
            saved = p.memory[i][choice[i]] - p.memory[i]
        local = _local_cost(p, nbrs, choice, i)
        with np.errstate(invalid="ignore"):  # inf - inf: an unusable config stays unusable
            extra = np.nan_to_num(np.maximum(local - local[choice[i]], 0.0), nan=np.inf)
        with np.errstate(invalid="ignore"):
            ratio = np.where(saved > 0, extra / np.where(saved > 0, saved, 1.0), np.inf)
        ratio = np.nan_to_num(ratio, nan=np.inf)
        c = int(np.argmin(ratio))
        return (float(ratio[c]), c) if np.isfinite(ratio[c]) else (np.inf, -1)

    moves = [best_move(i) for i in range(p.n)]
    budget = sum(p.sizes)  # each move lowers one node's memory: at most k - 1 moves per node
    while not p.fits(mem):
        budget -= 1
        if budget < 0:
            return None
        i = min(range(p.n), key=lambda j: moves[j][0])
        if moves[i][1] < 0:
            return None
        choice[i] = moves[i][1]
        mem = sum(float(m[c]) for m, c in zip(p.memory, choice))  # exact even past an inf
        for j in [i, *(w for w, _ in nbrs[i])]:
            moves[j] = best_move(j)
    return choice


def descend(p: Problem, choice: list[int], nbrs=None, passes: int = 20) -> list[int]:
    """Best single-node moves that keep the plan within memory, until none improves."""
    nbrs = nbrs or neighbours(p)
    choice = list(choice)
    mem = sum(float(m[c]) for m, c in zip(p.memory, choice)) if p.memory is not None else 0.0
    for _ in range(passes):
        moved = False
        for i in range(p.n):
            local = _local_cost(p, nbrs, choice, i)
            if p.memory is not None:
                new_mem = mem - p.memory[i][choice[i]] + p.memory[i]
                local = np.where(new_mem <= p.capacity * (1 + 1e-12), local, np.inf)
            c = int(np.argmin(local))
            if local[c] < local[choice[i]]:
                if p.memory is not None:
                    mem += float(p.memory[i][c] - p.memory[i][choice[i]])
                choice[i] = c
                moved = True
        if not moved:
            break
    return choice
