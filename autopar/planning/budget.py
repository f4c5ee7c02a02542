"""What the flat exact search would cost, before it runs, and when the hierarchical one takes over.

The flat search prices a reshard matrix per edge (configs of the producer x configs of the
consumer) and eliminates the graph over them; on a mesh of many prime axes a node has hundreds
to thousands of configs, and a deep model thousands of edges: the Llama 3 8B shape on 64 GPUs
holds 2.7e9 entries (minutes and gigabytes on a laptop-class machine), its 4-layer cut 3.4e8
(half a minute). ``flat_entries`` counts them from the configs alone (each distinct node
signature enumerated once: a fraction of a second), and ``over_budget`` says, in the words the
plan's search line takes, when they exceed ``FLAT_BUDGET``. The flat path searches each training
option set (ZeRO stage x recomputation x accumulation, ``planning/options.py``) with its own
tables and its own DP, so the work is the entries times the option sets: with the default
options (24 sets) the GPT-3-wide GPT on 64 A100s took over 12 minutes and 10 GB before this
count, whose single set of tables was within the budget. The count is of every set the search may
run (dominance skips some, but which ones depends on where memory binds, known only after the
searches), so the bound is one the search cannot exceed. Over it the planner then searches the
hierarchical space (degrees per cluster level, the tensor group's layout by the exact DP, each
repeated block solved once), which is coarser and says so.
"""

from __future__ import annotations

from autopar.core.cluster import Cluster
from autopar.core.ir import Graph
from autopar.core.space import configs_for
from autopar.cost_models.tables import signature

FLAT_BUDGET = 5e8  # reshard-table entries: about 40 s of tables and DP on the benchmark machine


def flat_entries(graph: Graph, cluster: Cluster) -> float:
    """Entries of the flat search's edge tables: the sum over edges of |configs(u)| x |configs(v)|."""
    mesh = cluster.mesh()
    by_sig: dict = {}
    count: dict[str, int] = {}
    for n in graph.nodes:
        sig = signature(n)
        if sig not in by_sig:
            by_sig[sig] = len(configs_for(n, mesh, "mesh"))
        count[n.name] = by_sig[sig]
    return float(sum(count[e.src] * count[e.dst] for e in graph.edges if e.src in count))


def over_budget(graph: Graph, cluster: Cluster, budget: float | None = None, sets: int = 1) -> str:
    """The search line's reason to leave the flat search, or "" when its tables times the ``sets``
    option sets it may search are within ``budget`` (default ``FLAT_BUDGET``)."""
    budget = FLAT_BUDGET if budget is None else budget
    entries = flat_entries(graph, cluster)
    if entries * max(1, sets) <= budget:
        return ""
    times = f" for each of {sets} training option sets" if sets > 1 else ""
    return (f"hierarchical search: the flat exact search's tables would hold {entries:.2g} entries on "
            f"{cluster.devices} devices{times}, over its budget of {budget:.2g}; the hierarchical space is coarser "
            f"(uniform degrees per level, one tensor-group layout per block)")


def too_large(error: Exception) -> str:
    """The search line's reason when the flat exact search refused its tables mid-way."""
    return f"hierarchical search: the flat exact search stopped ({str(error).split(';')[0]})"
