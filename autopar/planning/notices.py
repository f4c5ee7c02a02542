"""What the report must say when devices sit idle: mesh axes the plan splits nothing over, and why.

A plan that splits nothing over a mesh axis runs the same work on every device along it; on 3, 6
or 7 devices that is usually because no dim of the model divides by the axis, and a report that
only printed "1x faster" would hide it. Made with the plan, from its search tables, and saved.
"""

from __future__ import annotations

from autopar.core.ir import Graph
from autopar.core.tables import Config, CostTables, Mesh


def _uses(cfg: Config, axis: int) -> bool:
    return any(axis in axes for axes in cfg.mesh_axes)


def _example(nodes) -> str:
    """The heaviest of ``nodes`` and its dim sizes, e.g. 'blocks.0.fc1 (b=8, s=64, n=256, k=64)'."""
    node = max(nodes, key=lambda n: (getattr(n, "flops", 0) or 0, len(n.dims)))
    dims = ", ".join(f"{d.name}={d.size}" for d in node.dims)
    return f"{node.module or node.name} ({dims})"


def _reason(graph: Graph, tables: CostTables, axis: int, size: int) -> str:
    can = sum(1 for cfgs in tables.configs if any(_uses(c, axis) for c in cfgs))
    total = len(tables.nodes)
    odd = [n for n in graph.nodes if n.dims and not any(d.size % size == 0 for d in n.dims)]
    because = (f"{len(odd)} of {total} have no dim that divides by {size}, e.g. {_example(odd)}" if odd else
               f"their dims that divide by {size} have no split rule")
    if can == 0:
        return f"no node can be split over {size} devices ({because})"
    if 2 * can < total:
        return (f"{total - can} of {total} nodes cannot be split over {size} devices ({because}); "
                f"splitting the other {can} alone costs more than it saves")
    return f"splitting over {size} devices costs more than it saves for a model this small"


def mesh_axis_notices(graph: Graph, tables: CostTables, assignment: dict[str, Config], mesh: Mesh) -> list[str]:
    """One line per mesh axis no node is split over (or one line when that is every axis)."""
    idle = [a for a, k in enumerate(mesh.shape) if k > 1
            and not any(_uses(c, a) for c in assignment.values())]
    if not idle:
        return []
    reasons = {a: _reason(graph, tables, a, mesh.shape[a]) for a in idle}
    if len(idle) == sum(1 for k in mesh.shape if k > 1):  # nothing is split at all
        return ["why: " + "; ".join(dict.fromkeys(reasons.values()))]
    return [f"mesh axis {a} ({mesh.shape[a]} devices) splits no node: the devices along it repeat the same work; "
            f"{reasons[a]}" for a in idle]
