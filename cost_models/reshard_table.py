"""Edge tables of reshard prices: every (source layout, consumer layout) pair of an edge at once.

The design notes (why it is built this way, what was checked) are in docs/cost_model.md, "Edge tables in bulk".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.core.cluster import Cluster
from autopar.core.layout import Mesh

# Per mesh axis, what a (src, dst) placement pair asks for under phases; the order is the phase order.
P_NONE, P_SLICE, P_RS, P_AR, P_A2A, P_AG = range(6)
_PHASES = ((P_RS, "reduce-scatter"), (P_AR, "all-reduce"), (P_A2A, "all-to-all"), (P_AG, "all-gather"))

# Kind of a step of DTensor's walk (the order of ``np.select``'s tests in ``_half_walk``).
W_NONE, W_TO_PARTIAL, W_SLICE, W_RS, W_AR, W_A2A, W_AG = range(7)
_MERGEABLE = (W_RS, W_AR, W_AG)  # DTensor flattens consecutive equal steps of these into one collective
_COLLECTIVE = {W_RS: "reduce-scatter", W_AR: "all-reduce", W_A2A: "all-to-all", W_AG: "all-gather"}

# The ids that occur are found by marking a table over the whole id space while that space is at
# most max(_DENSE_LIMIT, _DENSE_PER_PAIR * pairs); beyond, by sorting the pairs' ids.
_DENSE_LIMIT = 1 << 24
_DENSE_PER_PAIR = 4


def _transition_table(n_codes: int) -> np.ndarray:
    """T[s, d]: the per-axis phase from placement code s to d (0 R, 1 P, >= 2 shards)."""
    t = np.zeros((n_codes, n_codes), dtype=np.int64)
    for s in range(n_codes):
        for d in range(n_codes):
            if s == d or d == 1:
                t[s, d] = P_NONE  # equal, or anything -> Partial: free
            elif s == 0:
                t[s, d] = P_SLICE if d >= 2 else P_NONE
            elif s == 1:
                t[s, d] = P_RS if d >= 2 else P_AR
            else:
                t[s, d] = P_A2A if d >= 2 else P_AG
    return t


def _unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if a.shape[1] == 0:  # an empty half: one (empty) sub-row
        return np.zeros((1, 0), dtype=a.dtype), np.zeros(len(a), dtype=np.intp)
    rows, inv = np.unique(a, axis=0, return_inverse=True)
    return rows, np.ravel(inv)


def _number(columns: list[tuple[np.ndarray, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Number the distinct rows of non-negative integer columns (value, radix): (id per row,
    index of one row per id). Packed into one int64 when the radices allow, else sorted as rows."""
    span = 1
    for _, radix in columns:
        span *= radix
    if span < 2**62:
        packed = np.zeros(len(columns[0][0]), dtype=np.int64)
        for col, radix in columns:
            packed = packed * radix + col
        _, rep, ids = np.unique(packed, return_index=True, return_inverse=True)
    else:
        _, rep, ids = np.unique(np.column_stack([c for c, _ in columns]), axis=0,
                                return_index=True, return_inverse=True)
    return np.ravel(ids), rep


@dataclass
class _Half:
    """One half's distinct evaluations: per id its phase digits (base 6, absolute axis weights),
    walk (base 14, ``kind * 2 + same codes as the previous active step``, walk order), whether a
    nested shard was cleared, and the codes of its boundary active step (-1: none)."""

    phase: np.ndarray
    walk: np.ndarray
    cleared: np.ndarray
    s: np.ndarray
    t: np.ndarray


def _half(S: np.ndarray, D: np.ndarray, outside: np.ndarray, axes: range, n_codes: int,
          boundary: str) -> tuple[np.ndarray, _Half]:
    """Evaluate K (src, dst) sub-row pairs of the mesh ``axes`` (``S``, ``D``: (K, len(axes)));
    ``outside``: (K,) bitmask of the codes the axes below this half shard differently. Returns
    an id per pair (equal ids, equal evaluations) and the evaluations by id."""
    K, w = S.shape
    table = _transition_table(n_codes)
    phase = np.zeros(K, dtype=np.int64)
    for j, a in enumerate(axes):
        phase += table[S[:, j], D[:, j]] * 6 ** a
    walk = np.zeros(K, dtype=np.int64)
    cleared = np.zeros(K, dtype=bool)
    last_s, last_t = np.full(K, -1, dtype=np.int64), np.full(K, -1, dtype=np.int64)
    first_s, first_t = np.full(K, -1, dtype=np.int64), np.full(K, -1, dtype=np.int64)
    for m in reversed(range(w)):  # DTensor's first pass: last mesh axis first
        t = D[:, m].astype(np.int64)
        moved = ((outside >> t) & 1).astype(bool)
        for i in range(m):
            moved |= (S[:, i] == t) != (D[:, i] == t)
        clear = moved & (t >= 2)
        cleared |= clear
        t = np.where(clear, 0, t)
        src = S[:, m].astype(np.int64)
        kind = np.select([src == t, t == 1, src == 0, (src == 1) & (t >= 2), src == 1, t >= 2],
                         [W_NONE, W_TO_PARTIAL, W_SLICE, W_RS, W_AR, W_A2A], W_AG)
        active = kind != W_NONE
        walk = walk * 14 + kind * 2 + (active & (src == last_s) & (t == last_t))
        first = active & (first_s < 0)
        first_s[first], first_t[first] = src[first], t[first]
        last_s[active], last_t[active] = src[active], t[active]
    s, t = (first_s, first_t) if boundary == "first" else (last_s, last_t)
    local_phase = phase // 6 ** axes.start if len(axes) else phase
    ids, rep = _number([(walk, 14 ** w), (cleared.astype(np.int64), 2), (s + 1, n_codes + 1),
                        (t + 1, n_codes + 1), (local_phase, 6 ** w)])
    return ids, _Half(phase[rep], walk[rep], cleared[rep], s[rep], t[rep])


@dataclass
class ReshardStructure:
    """The reshard prices of an edge table, short of bytes and links (see the module docstring).

    ``pair``: (sources, consumers) -> index of the pair's *price class*. The first
    ``len(phase_keys)`` classes are priced by phases (``phase_keys``: base 6, one digit per mesh
    axis; ``phase_cls``: the source class), the others by DTensor's walk (``walk_kinds``,
    ``walk_joins``: per step, walk order; ``walk_cls``). Source classes: ``factor[c]``, the shard
    factor (local bytes = nbytes / factor). Price classes are few (thousands), so pricing them
    costs little next to the one gather that builds the matrix.
    """

    pair: np.ndarray
    phase_keys: np.ndarray
    phase_cls: np.ndarray
    walk_kinds: np.ndarray
    walk_joins: np.ndarray
    walk_cls: np.ndarray
    factor: np.ndarray
    mesh: Mesh

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in vars(self).values() if isinstance(v, np.ndarray))

    def prices(self, nbytes: float, cluster: Cluster) -> np.ndarray:
        """Seconds per price class for a tensor of ``nbytes`` (global)."""
        local = nbytes / self.factor
        slope, intercept = _phase_prices(self.phase_keys, self.mesh, cluster)
        aligned = local[self.phase_cls] * slope + intercept
        if not len(self.walk_cls):
            return aligned
        n = len(self.mesh.shape)
        walked = _walk_prices(self.walk_kinds, self.walk_joins, local[self.walk_cls],
                              list(reversed(range(n))), self.mesh, cluster)
        return np.concatenate([aligned, walked])

    def matrix(self, nbytes: float, cluster: Cluster) -> np.ndarray:
        return np.take(self.prices(nbytes, cluster), self.pair)


def structure(s_codes: np.ndarray, d_codes: np.ndarray, mesh: Mesh) -> ReshardStructure:
    """Number every (src row, dst row) pair by what its reshard price depends on."""
    n = len(mesh.shape)
    R, C = len(s_codes), len(d_codes)
    h = n // 2
    n_codes = int(max(s_codes.max(initial=1), d_codes.max(initial=1))) + 1
    sL, sL_id = _unique_rows(s_codes[:, :h])
    dL, dL_id = _unique_rows(d_codes[:, :h])
    sH, sH_id = _unique_rows(s_codes[:, h:])
    dH, dH_id = _unique_rows(d_codes[:, h:])

    # bit c: the low axes shard tensor axis c differently in src and dst
    mask = np.zeros((len(sL), len(dL)), dtype=np.int64)
    for i in range(h):
        for c in range(2, n_codes):
            mask |= (((sL[:, i] == c)[:, None] != (dL[:, i] == c)[None, :]).astype(np.int64) << c)
    masks, mask_id = np.unique(mask, return_inverse=True)
    mask_id = mask_id.reshape(mask.shape)

    a, b, c = (x.ravel() for x in np.meshgrid(np.arange(len(sH)), np.arange(len(dH)),
                                              np.arange(len(masks)), indexing="ij"))
    hid, high = _half(sH[a], dH[b], masks[c], range(h, n), n_codes, "last")
    a, b = (x.ravel() for x in np.meshgrid(np.arange(len(sL)), np.arange(len(dL)), indexing="ij"))
    lid, low = _half(sL[a], dL[b], np.zeros(len(a), dtype=np.int64), range(h), n_codes, "first")

    # source classes: shard factor (local bytes = nbytes / factor) and whether it shards at all
    factor = np.prod(np.where(s_codes >= 2, np.asarray(mesh.shape, dtype=float), 1.0), axis=1)
    sharded = (s_codes >= 2).any(axis=1)
    cls, cls_rep = _number([(np.unique(factor, return_inverse=True)[1].ravel(), R + 1),
                            (sharded.astype(np.int64), 2)])
    n_high, n_low, n_cls = len(high.walk), len(low.walk), len(cls_rep)

    # the passes over the grid: a composite id per pair
    space = n_high * n_low * n_cls
    idx = np.int64 if space >= 2**31 else np.int32
    hid = (hid.reshape(len(sH), len(dH), len(masks)) * (n_low * n_cls)).astype(idx)
    lid = (lid.reshape(len(sL), len(dL)) * n_cls).astype(idx)
    pair = hid[sH_id[:, None], dH_id[None, :], mask_id[sL_id[:, None], dL_id[None, :]]]
    pair += lid[sL_id[:, None], dL_id[None, :]]
    pair += cls.astype(idx)[:, None]
    dense = space <= max(_DENSE_LIMIT, _DENSE_PER_PAIR * pair.size)
    if dense:
        seen = np.zeros(space, dtype=bool)
        seen[pair.ravel()] = True
        values = np.flatnonzero(seen)
        del seen
    else:
        values, inv = np.unique(pair, return_inverse=True)
    if 14 ** n * n_cls >= 2**62:
        raise ValueError(f"a mesh of {n} axes is beyond the bulk reshard pricing (at most 14 axes)")
    ph, rest = np.divmod(values, n_low * n_cls)
    pl, pc = np.divmod(rest, n_cls)

    # misaligned: some axis clears a nested shard, and the source shards something
    mis = (high.cleared[ph] | low.cleared[pl]) & sharded[cls_rep[pc]]
    # the whole walk: the low half's first step joins the high half's last one when codes agree
    joined = (low.s[pl] >= 0) & (low.s[pl] == high.s[ph]) & (low.t[pl] == high.t[ph])
    first_w = np.zeros(n_low, dtype=np.int64)  # weight of the low walk's first active step's digit
    if h:
        active = _decode(low.walk, h)[0] != W_NONE
        first_w = np.where(active.any(axis=1), 14 ** (h - 1 - np.argmax(active, axis=1)).astype(np.int64), 0)
    walk = high.walk[ph] * 14 ** h + low.walk[pl] + np.where(joined, first_w[pl], 0)

    # price classes: (phase key, source class) of the aligned ids, then (walk, source class)
    phases, a_of = np.unique((high.phase[ph] + low.phase[pl])[~mis] * n_cls + pc[~mis],
                             return_inverse=True)
    walks, w_of = np.unique(walk[mis] * n_cls + pc[mis], return_inverse=True)
    price_class = np.empty(len(values), dtype=idx)
    price_class[~mis] = np.ravel(a_of)
    price_class[mis] = len(phases) + np.ravel(w_of)
    if dense:
        lut = np.empty(space, dtype=idx)
        lut[values] = price_class
        pair = np.take(lut, pair)
    else:
        pair = price_class[np.ravel(inv)].reshape(R, C)
    kinds, joins = _decode(walks // n_cls, n)
    return ReshardStructure(pair=pair, phase_keys=phases // n_cls, phase_cls=phases % n_cls,
                            walk_kinds=kinds, walk_joins=joins, walk_cls=walks % n_cls,
                            factor=factor[cls_rep], mesh=mesh)


def _phase_prices(keys: np.ndarray, mesh: Mesh, cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """Per base-6 phase key: seconds = local * slope + intercept (``comm.reshard_steps``' phases)."""
    from autopar.cost_models.alpha_beta import BANDWIDTH_TERM, LATENCY_TERM, as_run, copy_rate

    n = len(mesh.shape)
    level = np.asarray(mesh.level or (0,) * n) > 0
    sizes = np.asarray(mesh.shape, dtype=float)
    types = (keys[:, None] // 6 ** np.arange(n, dtype=np.int64)[None, :]) % 6

    def group(kind):
        mask = types == kind
        p = np.prod(np.where(mask, sizes, 1.0), axis=1)
        cross = (mask & level).any(axis=1)
        bw = np.where(cross, cluster.inter_bandwidth, cluster.intra_bandwidth)
        lat = np.where(cross, cluster.inter_latency, cluster.intra_latency)
        return p, bw, lat

    p_slice = group(P_SLICE)[0]
    scale = 1.0 / p_slice  # local bytes after slicing, per byte of the source's local
    # the slice's local work (``comm._slice``): its call, and the copy of the block it keeps
    slope = np.where(p_slice > 1, copy_rate("slice", cluster, p_slice) * scale, 0.0)
    intercept = np.where(p_slice > 1, cluster.move_call, 0.0)
    for kind, name in _PHASES:
        p, bw, lat = group(kind)
        k = scale * (p if kind == P_AG else 1.0)
        run, k = as_run(name, k, p, cluster.backend)  # what the backend runs (gloo: see as_run)
        bw, lat = cluster.kind_link(run, bw, lat)
        slope += np.where(p > 1, BANDWIDTH_TERM[run](np.maximum(p, 1)) * k / bw, 0.0)
        intercept += np.where(p > 1, LATENCY_TERM[run](np.maximum(p, 1)) * lat + cluster.call_latency, 0.0)
        # the step's local work (``reshard_local``): its call, and its copy per byte run
        intercept += np.where(p > 1, cluster.move_call, 0.0)
        slope += np.where(p > 1, copy_rate(name, cluster, np.maximum(p, 1)) * k, 0.0)
        if kind == P_RS:
            scale = scale / p
    return slope, intercept


def _decode(walks: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Base-14 walks of ``n`` steps -> (kinds, same-codes flags), one column per step in walk order."""
    digits = (walks[:, None] // 14 ** np.arange(n - 1, -1, -1, dtype=np.int64)[None, :]) % 14
    return digits // 2, (digits % 2).astype(bool)


def _walk_prices(kinds: np.ndarray, joins: np.ndarray, local: np.ndarray, walk_axes: list[int],
                 mesh: Mesh, cluster: Cluster) -> np.ndarray:
    """Seconds of each walk (rows of per-step kinds and same-codes flags, steps on ``walk_axes``).

    A step with the same codes as the previous active one joins its group when mergeable; a group
    is priced when the next one starts (or at the end), on the local bytes at that point, in the
    order and with the arithmetic of ``comm._dtensor_steps``. DTensor's second pass (first axis
    to last) only slices back what the first cleared: local, free.
    """
    from autopar.cost_models.alpha_beta import as_run, collective_time, reshard_local

    rows = len(kinds)
    local = np.asarray(local, dtype=float).copy()
    total = np.zeros(rows)
    level = mesh.level or (0,) * len(mesh.shape)
    pend = np.full(rows, W_NONE, dtype=np.int64)
    pend_p = np.ones(rows)
    pend_cross = np.zeros(rows, dtype=bool)

    def flush(ending: np.ndarray) -> None:
        ending = ending & (pend != W_NONE)
        if not ending.any():
            return
        bw = np.where(pend_cross, cluster.inter_bandwidth, cluster.intra_bandwidth)
        lat = np.where(pend_cross, cluster.inter_latency, cluster.intra_latency)
        sliced = ending & (pend == W_SLICE)
        local[sliced] /= pend_p[sliced]
        total[sliced] += reshard_local("slice", local[sliced], pend_p[sliced], cluster)
        ag = ending & (pend == W_AG)
        local[ag] *= pend_p[ag]
        for kind, name in _COLLECTIVE.items():
            mask = ending & (pend == kind)
            if mask.any():
                run, nbytes = as_run(name, local[mask], pend_p[mask], cluster.backend)
                b, a = cluster.kind_link(run, bw[mask], lat[mask])
                total[mask] += (collective_time(run, nbytes, pend_p[mask], b, a, cluster.call_latency)
                                + reshard_local(name, nbytes, pend_p[mask], cluster))
        rs = ending & (pend == W_RS)
        local[rs] /= pend_p[rs]
        pend[ending] = W_NONE

    for q, m in enumerate(walk_axes):
        k = kinds[:, q]
        active = k != W_NONE
        same = active & joins[:, q] & np.isin(k, _MERGEABLE)
        new = active & ~same
        flush(new)
        pend[new] = k[new]
        pend_p[new] = float(mesh.shape[m])
        pend_cross[new] = level[m] > 0
        pend_p[same] *= mesh.shape[m]
        pend_cross[same] |= level[m] > 0
    flush(np.ones(rows, dtype=bool))
    return total


@dataclass
class StructureCache:
    """Structures by (layouts, mesh), kept up to ``max_bytes`` (oldest dropped first).

    Owned by a cost model instance, so one plan's edge tables share it: edges whose layouts are
    equal (other tensors of the same shapes and configs, a gradient's layouts that repeat a forward
    pair's) reuse the numbering and only re-price their few classes. On the 48-layer GPT over 64
    devices about half the tables of a plan call find their structure here.
    """

    max_bytes: int = 256 * 2**20
    hits: int = 0
    misses: int = 0

    def __post_init__(self):
        self._items: dict[tuple, ReshardStructure] = {}
        self._bytes = 0

    def get(self, s_codes: np.ndarray, d_codes: np.ndarray, mesh: Mesh) -> ReshardStructure:
        s_codes, d_codes = np.ascontiguousarray(s_codes, np.int64), np.ascontiguousarray(d_codes, np.int64)
        key = (mesh.shape, mesh.level, s_codes.shape, s_codes.tobytes(), d_codes.shape, d_codes.tobytes())
        found = self._items.get(key)
        if found is not None:
            self.hits += 1
            return found
        self.misses += 1
        st = structure(s_codes, d_codes, mesh)
        if st.nbytes <= self.max_bytes:
            while self._items and self._bytes + st.nbytes > self.max_bytes:
                oldest = next(iter(self._items))
                self._bytes -= self._items.pop(oldest).nbytes
            self._items[key] = st
            self._bytes += st.nbytes
        return st


def reshard_table(nbytes: float, s_codes: np.ndarray, d_codes: np.ndarray, mesh: Mesh,
                  cluster: Cluster, cache: StructureCache | None = None) -> np.ndarray:
    """``M[i, j]``: seconds to reshard ``nbytes`` from layout row ``s_codes[i]`` to ``d_codes[j]``."""
    if len(mesh.shape) == 0 or not len(s_codes) or not len(d_codes):
        return np.zeros((len(s_codes), len(d_codes)))
    st = cache.get(s_codes, d_codes, mesh) if cache is not None else structure(
        np.asarray(s_codes, np.int64), np.asarray(d_codes, np.int64), mesh)
    return st.matrix(nbytes, cluster)
