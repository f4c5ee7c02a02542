"""Search speed of the exact DP on synthetic tables shaped like PaSE's benchmarks (and on PaSE's
own tables when its cost model is importable). Timings only: no test asserts a wall-clock time.

    .venv/bin/python -m benchmarks.search_speed_synthetic [--repeat 3] [--quick]

Graphs:
* ``transformer-like``: PaSE's Transformer topology (docs/pase.md §7.4: 204 nodes, 256
  edges, 6 encoder + 6 decoder layers, every decoder reading the last encoder norm) with config
  counts about twice those of PaSE's p=64 space (up to 1100), random tables shared per role, as
  a cost model gives identical layers identical tables.
* ``chain-12x8``: 12 attention-like blocks of 8 nodes with ~1000 configs each (diamond
  QKV -> (QK -> softmax, V) -> AV, a residual around the block).
* ``pase-*``: PaSE's own tables (cost_models/pase.py) at p=64.
* ``..., memory``: the same with a memory capacity that binds (Lagrangian multipliers, then the
  ILP if small enough; ``gap`` says what is proven).
Each line: median of ``repeat`` runs of dp (reuse on), the plan's work with and without reuse.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from autopar.search import dp, dp_plan
from autopar.core.tables import Config, CostTables

TRANSFORMER_SIZES = {"emb": 1000, "add": 84, "norm": 84, "qkv": 1100, "unstack": 460, "qk": 924,
                     "softmax": 210, "av": 924, "out": 924, "ff1": 460, "ff2": 460, "stack": 210,
                     "xqkv": 1100, "final": 900, "sce": 210}


class _Builder:
    """Nodes by role; a table per role (node) and per (role, role) pair (edge), drawn once."""

    def __init__(self, sizes: dict[str, int], seed: int = 0):
        self.sizes, self.rng = sizes, np.random.default_rng(seed)
        self.roles: list[str] = []
        self.edges: list[tuple[int, int]] = []
        self.node_tables: dict[str, np.ndarray] = {}
        self.edge_tables: dict[tuple[str, str], np.ndarray] = {}

    def node(self, role: str) -> int:
        self.roles.append(role)
        return len(self.roles) - 1

    def edge(self, u: int, v: int) -> None:
        self.edges.append((u, v))

    def tables(self) -> CostTables:
        def node_table(role):
            if role not in self.node_tables:
                self.node_tables[role] = self.rng.random(self.sizes[role]) * 1e3
            return self.node_tables[role]

        def edge_table(a, b):
            if (a, b) not in self.edge_tables:
                self.edge_tables[(a, b)] = self.rng.random((self.sizes[a], self.sizes[b])) * 1e3
            return self.edge_tables[(a, b)]

        edge_cost = {}
        for u, v in self.edges:
            m = edge_table(self.roles[u], self.roles[v])
            edge_cost[(u, v)] = edge_cost[(u, v)] + m if (u, v) in edge_cost else m
        return CostTables(nodes=[f"{r}{i}" for i, r in enumerate(self.roles)],
                          configs=[[Config((c,)) for c in range(self.sizes[r])] for r in self.roles],
                          node_cost=[node_table(r) for r in self.roles], edge_cost=edge_cost)


def _mha(b: _Builder, x: int, cross_from: int | None = None) -> int:
    if cross_from is None:
        qkv = b.node("qkv")
        b.edge(x, qkv)
    else:
        stack = b.node("stack")
        b.edge(x, stack)
        b.edge(cross_from, stack)
        qkv = b.node("xqkv")
        b.edge(stack, qkv)
    un, qk, sm, av, out, add, norm = (b.node(r) for r in
                                      ("unstack", "qk", "softmax", "av", "out", "add", "norm"))
    for u, v in ((qkv, un), (un, qk), (qk, sm), (sm, av), (un, av), (av, out), (x, add),
                 (out, add), (add, norm)):
        b.edge(u, v)
    return norm


def _ffn(b: _Builder, x: int) -> int:
    f1, f2, add, norm = (b.node(r) for r in ("ff1", "ff2", "add", "norm"))
    for u, v in ((x, f1), (f1, f2), (x, add), (f2, add), (add, norm)):
        b.edge(u, v)
    return norm


def transformer_like(layers: int = 6, sizes: dict[str, int] = TRANSFORMER_SIZES) -> CostTables:
    b = _Builder(sizes)
    x = b.node("emb")
    pos = b.node("add")
    b.edge(x, pos)
    x = pos
    for _ in range(layers):
        x = _ffn(b, _mha(b, x))
    enc = x
    y = b.node("emb")
    pos = b.node("add")
    b.edge(y, pos)
    y = pos
    for _ in range(layers):
        y = _ffn(b, _mha(b, _mha(b, y), cross_from=enc))
    final = b.node("final")
    b.edge(y, final)
    b.edge(final, b.node("sce"))
    return b.tables()


def chain(blocks: int = 12, configs: int = 1000) -> CostTables:
    roles = ("qkv", "unstack", "qk", "softmax", "av", "out", "add", "norm")
    b = _Builder({r: configs for r in roles} | {"in": configs})
    x = b.node("in")
    for _ in range(blocks):
        qkv = b.node("qkv")
        b.edge(x, qkv)
        un, qk, sm, av, out, add, norm = (b.node(r) for r in roles[1:])
        for u, v in ((qkv, un), (un, qk), (qk, sm), (sm, av), (un, av), (av, out), (x, add),
                     (out, add), (add, norm)):
            b.edge(u, v)
        x = norm
    return b.tables()


def with_memory(tables: CostTables, fraction: float = 0.5, seed: int = 1) -> CostTables:
    """The same tables with per-role memory vectors and a capacity ``fraction`` of the way from
    the least possible memory to the unconstrained optimum's, so the limit binds."""
    rng = np.random.default_rng(seed)
    by_role: dict[str, np.ndarray] = {}
    memory = []
    for name, cfgs in zip(tables.nodes, tables.configs):
        role = name.rstrip("0123456789")
        if role not in by_role:
            by_role[role] = rng.integers(1, 1000, len(cfgs)).astype(float) * 2**20
        memory.append(by_role[role])
    free = dp(tables)
    least = sum(float(m.min()) for m in memory)
    used = sum(float(m[c]) for m, c in zip(memory, free.choice))
    return CostTables(tables.nodes, tables.configs, tables.node_cost, tables.edge_cost, memory,
                      memory_capacity=least + fraction * (used - least), units=tables.units)


def _pase(name: str, p: int):
    try:
        from autopar.pase.model import pase_tables
        from autopar.pase import reference as ref
    except ImportError:
        return None
    graph, kappa = {"inception3": (lambda: ref.inception3_graph(128), 4),
                    "transformer": (lambda: ref.transformer_graph(64), 1)}[name]
    return pase_tables(graph(), p, kappa)


def measure(name: str, tables: CostTables, repeat: int, reuse: bool = True) -> None:
    plan = dp_plan(tables, reuse=reuse)
    times, sol = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        sol = dp(tables, reuse=reuse)
        times.append(time.perf_counter() - start)
    print(f"{name:28s} reuse={'on ' if reuse else 'off'} {sol.search:6s} gap={sol.gap:.2g} nodes={len(tables.nodes):3d} "
          f"edges={len(tables.edge_cost):3d} max_cfg={max(len(c) for c in tables.configs):5d} "
          f"order={plan.order_name:10s} work={plan.work:.3g} (no reuse {plan.work_without_reuse:.3g}) "
          f"tables={plan.message_bytes / 2**20:.0f} MiB  median {statistics.median(times):.2f} s "
          f"of {[round(t, 2) for t in times]}  cost={sol.cost:.6g}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="skip the runs with reuse off")
    args = ap.parse_args()
    tl = transformer_like()
    cases = [("transformer-like", tl), ("transformer-like, memory", with_memory(tl)),
             ("chain-12x8 (1000 cfg)", chain())]
    for p in (64,):
        for model in ("inception3", "transformer"):
            t = _pase(model, p)
            if t is not None:
                cases.append((f"pase-{model} p={p}", t))
    for name, tables in cases:
        measure(name, tables, args.repeat)
        if not args.quick:
            if dp_plan(tables, reuse=False).work <= 2e10:
                measure(name, tables, 1, reuse=False)
            else:
                print(f"{name:28s} reuse=off skipped: {dp_plan(tables, reuse=False).work:.3g} terms")


if __name__ == "__main__":
    main()
