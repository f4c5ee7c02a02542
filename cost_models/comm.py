"""Alpha-beta costs of collectives on the device mesh, and of resharding a tensor between layouts.

The design notes (why it is built this way, what was checked) are in docs/cost_model.md, "Collectives and reshards".
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from autopar.cost_models.alpha_beta import (BANDWIDTH_TERM, FORMULA, KINDS, LATENCY_TERM, as_run,  # noqa: F401
                                            collective_time, reshard_local)
from autopar.cost_models.reshard_table import reshard_table

from autopar.core.cluster import Cluster
from autopar.core.layout import Layout, Partial, Replicate, Shard, to_mesh
from autopar.core.tables import Mesh


@dataclass(frozen=True)
class Collective:
    """One priced collective, with what a reader needs to redo the arithmetic."""

    kind: str
    axes: tuple[int, ...]  # mesh axes of the group
    p: int
    nbytes: float  # N of the formula
    bandwidth: float
    latency: float
    crosses_nodes: bool
    seconds: float

    run_as: str = ""  # the collective the backend really runs, where it differs (``as_run``)
    run_bytes: float = 0.0
    fixed: float = 0.0  # paid once (``Cluster.call_latency``)
    local: float = 0.0  # a reshard step's runtime path and buffer copy (``alpha_beta.reshard_local``)

    def formula(self) -> str:
        kind, nbytes = (self.run_as, self.run_bytes) if self.run_as else (self.kind, self.nbytes)
        bw, a = f"{self.bandwidth:.4g}", f"{self.latency:.3g}"
        p, n = self.p, f"{nbytes:.6g}"
        body = {"all-reduce": f"2*{p - 1}/{p}*{n}/{bw} + 2*{p - 1}*{a}",
                "all-gather": f"{p - 1}/{p}*{n}/{bw} + {p - 1}*{a}",
                "reduce-scatter": f"{p - 1}/{p}*{n}/{bw} + {p - 1}*{a}",
                "all-to-all": f"{p - 1}/{p}*{n}/{bw} + {p - 1}*{a}",
                "broadcast": f"{n}/{bw} + {p - 1}*{a}", "send/recv": f"{n}/{bw} + {a}"}[kind]
        if self.fixed:
            body += f" + {self.fixed:.3g}"
        if self.local:
            body += f" + {self.local:.3g} (local: the move's path and its buffer copy)"
        link = "inter-node" if self.crosses_nodes else "intra-node"
        run = f", run by gloo as {kind} of N = {n} B" if self.run_as else ""
        return (f"{self.kind} over mesh axes {list(self.axes)} (p={p}, {link}{run}): "
                f"{FORMULA[kind]}{' + c' if self.fixed else ''}{' + local' if self.local else ''} = {body} = {self.seconds:.4g} s")


def group_of(axes, mesh: Mesh) -> tuple[int, bool]:
    """(p, crosses_nodes) of the group of mesh ``axes``."""
    p, cross = 1, False
    level = mesh.level or (0,) * len(mesh.shape)
    for a in axes:
        p *= mesh.shape[a]
        cross = cross or level[a] > 0
    return p, cross


def all_to_alls(steps, axes, mesh: Mesh, cluster: Cluster, near: Cluster | None = None,
                near_steps: tuple[str, ...] = ()) -> tuple[float, str]:
    """Seconds of a list of all-to-alls over the group of mesh ``axes`` (``steps``: ``(_, what,
    bytes per device)`` each) and their arithmetic; ``near``: the cluster whose links price the
    steps named in ``near_steps`` (those that follow another with no compute between)."""
    p, cross = group_of(axes, mesh)
    times = []
    for _, what, n in steps:
        c = near if near is not None and what in near_steps else cluster
        bw, lat = c.kind_link("all-to-all", *c.link(cross))
        times.append(collective_time("all-to-all", n, p, bw, lat, c.call_latency))
    text = (f"{len(steps)} all-to-alls over mesh axes {list(axes)} (p={p}), {FORMULA['all-to-all']} each: "
            + ", ".join(f"{what} N = {n:.6g} B: {t:.4g} s" for (_, what, n), t in zip(steps, times)))
    return sum(times), text


def per_config(price, node, configs, mesh: Mesh, cluster: Cluster, mode: str) -> np.ndarray:
    """``price(node, config, mesh, cluster, mode)[0]`` for every config on the mesh (0 where a
    config does not map onto it)."""
    out = np.zeros(len(configs))
    for i, c in enumerate(configs):
        m = to_mesh(c, mesh)
        if m is not None:
            out[i] = price(node, m, mesh, cluster, mode)[0]
    return out


def collective(kind: str, nbytes: float, axes, mesh: Mesh, cluster: Cluster) -> Collective:
    """Price ``kind`` over the group of mesh ``axes`` with ``nbytes`` per device."""
    if kind not in BANDWIDTH_TERM:
        raise ValueError(f"unknown collective {kind!r}; known: {', '.join(KINDS)}")
    axes = tuple(sorted(axes))
    p, cross = group_of(axes, mesh)
    bw, lat = cluster.link(cross)
    run, run_bytes = as_run(kind, nbytes, p, cluster.backend) if p > 1 else (kind, nbytes)
    bw, lat = cluster.kind_link(run, bw, lat)
    fixed = cluster.call_latency
    return Collective(kind, axes, p, float(nbytes), bw, lat, cross, collective_time(run, run_bytes, p, bw, lat, fixed),
                      run if run != kind else "", float(run_bytes) if run != kind else 0.0, fixed)


# --- resharding ----------------------------------------------------------------------------------

def reshard_step(kind: str, nbytes: float, axes, mesh: Mesh, cluster: Cluster) -> Collective:
    """``collective`` as a reshard runs it: with what the rank pays around the call
    (``alpha_beta.reshard_local``; 0 on a cluster that does not measure it)."""
    c = collective(kind, nbytes, axes, mesh, cluster)
    local = reshard_local(kind, c.run_bytes or c.nbytes, c.p, cluster)
    return replace(c, seconds=c.seconds + local, local=local) if local else c


def _slice(local: float, axes, mesh: Mesh, cluster: Cluster) -> Collective:
    """A local slice to ``local`` bytes over mesh ``axes``: no collective, but the runtime's move
    and its copy of the block (``reshard_local``; free where the cluster does not measure it)."""
    p, _ = group_of(axes, mesh)
    t = reshard_local("slice", local, p, cluster)
    return Collective("slice", tuple(axes), p, float(local), 0.0, 0.0, False, t, local=t)


def reshard_steps(nbytes: float, src: Layout, dst: Layout, mesh: Mesh,
                  cluster: Cluster) -> list[Collective]:
    """The collectives that turn a tensor of ``nbytes`` (global) from ``src`` into ``dst``."""
    return [c for c in _walk(nbytes, src, dst, mesh, cluster) if c.kind != "slice"]


def _walk(nbytes: float, src: Layout, dst: Layout, mesh: Mesh, cluster: Cluster) -> list[Collective]:
    """``reshard_steps`` with the local slices among them, in the order they run."""
    if len(src) != len(dst) or len(src) != len(mesh.shape):
        raise ValueError(f"layouts {src} -> {dst} do not match a mesh of {len(mesh.shape)} axes")
    sf = 1
    for a, pl in enumerate(src):
        if isinstance(pl, Shard):
            sf *= mesh.shape[a]
    local = nbytes / sf
    book: dict = {}
    s_codes, d_codes = (tuple(int(c) for c in encode_layouts([x], book)[0]) for x in (src, dst))
    if misaligned(s_codes, d_codes):
        return _dtensor_steps(local, s_codes, d_codes, mesh, cluster)
    steps: list[Collective] = []
    sliced = [a for a in range(len(src)) if isinstance(src[a], Replicate) and isinstance(dst[a], Shard)]
    local /= group_of(sliced, mesh)[0]
    if sliced:
        steps.append(_slice(local, sliced, mesh, cluster))
    rs = [a for a in range(len(src)) if isinstance(src[a], Partial) and isinstance(dst[a], Shard)]
    if rs:
        steps.append(reshard_step("reduce-scatter", local, rs, mesh, cluster))
        local /= group_of(rs, mesh)[0]
    ar = [a for a in range(len(src)) if isinstance(src[a], Partial) and isinstance(dst[a], Replicate)]
    if ar:
        steps.append(reshard_step("all-reduce", local, ar, mesh, cluster))
    a2a = [a for a in range(len(src))
           if isinstance(src[a], Shard) and isinstance(dst[a], Shard) and src[a] != dst[a]]
    if a2a:
        steps.append(reshard_step("all-to-all", local, a2a, mesh, cluster))
    ag = [a for a in range(len(src)) if isinstance(src[a], Shard) and isinstance(dst[a], Replicate)]
    if ag:
        steps.append(reshard_step("all-gather", local * group_of(ag, mesh)[0], ag, mesh, cluster))
    return [s for s in steps if s.p > 1]


# --- nested shard order: what DTensor runs --------------------------------------------------------
#
# A tensor axis cut by several mesh axes is sharded in mesh-axis order, the lowest axis major. The
# per-axis phases above hold while every mesh axis that changes its placement of a tensor axis
# sees the same sharding of that axis on the lower mesh axes before and after. When it does not
# (``misaligned``), DTensor 2.13's ``generate_greedy_transform_infos`` first walks the mesh axes
# from the last to the first and turns every such axis's placement into Replicate (the nested
# shard is gathered, or a partial all-reduced, before anything else), doing the aligned
# transitions on the way, then walks them from the first to the last to reach the target
# (slicing again). ``_dtensor_steps`` prices that sequence, step by step on the local bytes;
# consecutive steps of one kind with the same placements are priced as one collective over
# their group (DTensor merges them over a flattened mesh; an all-to-all never merges).
# ``reshard_table`` gives the same prices to a whole edge table at once.
# Layouts are codes here (``encode_layouts``: 0 R, 1 P, >= 2 one code per Shard).


def _clears(src: tuple[int, ...], dst: tuple[int, ...], m: int) -> bool:
    """Mesh axis ``m`` wants a shard whose tensor axis the axes below it shard differently in
    ``src`` and ``dst``: DTensor replicates ``m`` first (when the source shards anything)."""
    t = dst[m]
    return t >= 2 and any((src[i] == t) != (dst[i] == t) for i in range(m))


def misaligned(src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
    """Does DTensor's greedy redistribute replicate some mesh axis first (nested shard order)?"""
    return any(c >= 2 for c in src) and any(_clears(src, dst, m) for m in range(len(dst)))


def dtensor_transitions(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(mesh axis, from code, to code) in the order DTensor's greedy redistribute runs them."""
    cur, out = list(src), []
    if any(c >= 2 for c in src):
        for m in reversed(range(len(cur))):
            t = 0 if _clears(src, dst, m) else dst[m]  # a nested shard is replicated first
            if cur[m] != t:
                out.append((m, cur[m], t))
                cur[m] = t
    for m in range(len(cur)):
        if cur[m] != dst[m]:
            out.append((m, cur[m], dst[m]))
            cur[m] = dst[m]
    return out


def _kind(s: int, d: int) -> str | None:
    if d == 1 or s == 0:
        return None  # -> Partial, R -> S: local
    if s == 1:
        return "reduce-scatter" if d >= 2 else "all-reduce"
    return "all-to-all" if d >= 2 else "all-gather"


def _dtensor_steps(local: float, src: tuple[int, ...], dst: tuple[int, ...], mesh: Mesh,
                   cluster: Cluster) -> list[Collective]:
    """Price ``dtensor_transitions(src, dst)`` from ``local`` bytes per device."""
    groups: list[tuple[tuple[int, int], list[int], bool]] = []
    # the second pass only slices back what the first cleared: priced as free (as reshard_table's walk)
    first = sum((0 if _clears(src, dst, m) else dst[m]) != src[m] for m in range(len(src)))
    for i, (m, s, d) in enumerate(dtensor_transitions(src, dst)):
        k = _kind(s, d)
        if groups and groups[-1][0] == (s, d) and k in ("all-reduce", "all-gather",
                                                        "reduce-scatter"):
            groups[-1][1].append(m)
        else:
            groups.append(((s, d), [m], i < first))
    steps = []
    for (s, d), axes, in_first in groups:
        k = _kind(s, d)
        p = group_of(axes, mesh)[0]
        if k is None:
            if d >= 2:
                local /= p
                if in_first:
                    steps.append(_slice(local, axes, mesh, cluster))
            continue
        if k == "all-gather":
            local *= p
        steps.append(reshard_step(k, local, axes, mesh, cluster))
        if k == "reduce-scatter":
            local /= p
    return [c for c in steps if c.p > 1]


def reshard_cost(nbytes: float, src: Layout, dst: Layout, mesh: Mesh, cluster: Cluster) -> float:
    return sum(s.seconds for s in _walk(nbytes, src, dst, mesh, cluster))


def encode_layouts(layouts: list[Layout], codebook: dict) -> np.ndarray:
    """Layouts as an int matrix (one row per layout): R=0, P=1, each distinct Shard >= 2."""
    out = np.empty((len(layouts), len(layouts[0]) if layouts else 0), dtype=np.int64)
    for i, lay in enumerate(layouts):
        for a, pl in enumerate(lay):
            if isinstance(pl, Replicate):
                out[i, a] = 0
            elif isinstance(pl, Partial):
                out[i, a] = 1
            else:
                out[i, a] = codebook.setdefault(pl, 2 + len(codebook))
    return out


def reshard_matrix(nbytes: float, src: list[Layout], dst: list[Layout], mesh: Mesh,
                   cluster: Cluster) -> np.ndarray:
    """``M[i, j] = reshard_cost(nbytes, src[i], dst[j])``, computed on unique layouts in numpy."""
    if not src or not dst:
        return np.zeros((len(src), len(dst)))
    book: dict = {}
    return reshard_matrix_codes(nbytes, encode_layouts(src, book), encode_layouts(dst, book),
                                mesh, cluster)


def reshard_matrix_codes(nbytes: float, src: np.ndarray, dst: np.ndarray, mesh: Mesh,
                         cluster: Cluster, cache=None) -> np.ndarray:
    """``reshard_matrix`` on layouts already encoded (``encode_layouts``, one codebook).

    Computed in bulk by ``reshard_table`` (the same prices as ``reshard_cost`` per pair);
    ``cache``: a ``reshard_table.StructureCache`` shared by the edges of one plan."""
    return reshard_table(nbytes, src, dst, mesh, cluster, cache)
