"""Among plans of equal cost, the one nearest data parallelism.

An exact search returns one optimum; where several assignments cost the same (a node whose
configs are all free: a view, a reshape of the labels), which one it returns is an accident of
config order. The accident shows to users: the zoo gpt's best plan on 2 CPU processes read its
labels whole (a free view) and sliced them after, so its inputs were sliced differently from
each other and ``inputs="local"`` could not be fed by a ``DistributedSampler`` (one-line error);
and that plan was data parallelism in all but the label view. ``prefer_data_parallel`` moves each
node, one at a time, to its data-parallel config wherever that costs nothing (node, edges to its
neighbours as they are then) and holds no more memory, so the optimum's cost is unchanged.
"""

from __future__ import annotations

from autopar.core.tables import CostTables, Solution


def prefer_data_parallel(tables: CostTables, sol: Solution, dp_choice: list[int]) -> Solution:
    """``sol`` with nodes moved to their ``dp_choice`` configs where the total cost and memory do
    not grow (a relative 1e-12 of the total: float sums in another order); ``sol`` itself when
    none moves."""
    choice = list(sol.choice)
    near: dict[int, list[tuple[int, bool]]] = {i: [] for i in range(len(choice))}
    for u, v in tables.edge_cost:
        near[u].append((v, True))
        near[v].append((u, False))
    slack = 1e-12 * max(abs(sol.cost), 1e-30)
    moved = False
    for i, want in enumerate(dp_choice):
        have = choice[i]
        if want == have:
            continue

        def local(c: int, i: int = i) -> float:
            t = float(tables.node_cost[i][c])
            for j, out in near[i]:
                m = tables.edge_cost[(i, j) if out else (j, i)]
                t += float(m[c, choice[j]] if out else m[choice[j], c])
            return t

        if local(want) > local(have) + slack:
            continue
        if tables.memory and float(tables.memory[i][want]) > float(tables.memory[i][have]):
            continue
        choice[i], moved = want, True
    if not moved:
        return sol
    return Solution(choice, tables.total(choice), tables.total_memory(choice), sol.search, sol.seconds,
                    sol.gap, sol.detail, sol.free_cost)
