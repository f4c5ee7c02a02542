"""Bulk pricing of reshards that DTensor runs in nested shard order (``comm.misaligned`` pairs).

``comm._dtensor_steps`` prices one (src, dst) layout pair by walking DTensor 2.13's greedy
redistribute: the mesh axes last to first, replicating a nested shard that the axes below it
shard differently (``clear``) and doing the other transitions on the way, then first to last,
slicing back (free). An edge table asks this for every pair of its source's and consumer's
configs: over a million pairs per edge on a 6-axis mesh, so the walk cannot run per pair.

What makes it cheap: a pair's walk is fixed by a handful of small facts.

* Split the mesh axes into a low half L (the first ``n // 2``) and a high half H. The walk visits
  H first. On an H axis, ``clear`` needs to know whether the L axes shard the target's tensor axis
  differently in src and dst: one bit per placement code, a *mask* that depends on the L sub-rows
  only. Given that mask, the H part of the walk depends on the H sub-rows only.
* The L part of the walk depends on the L sub-rows only, except whether its first collective
  joins the last one of H (same codes: one collective over both groups), which is decided by the
  two halves' boundary codes.
* Sub-rows are few (tens per half on the 6-axis 8x8xH100 mesh), so each half's walk is computed
  on every (src sub-row, dst sub-row[, mask]) combination, numbered, and a pair's whole walk is
  the pair of those numbers. With the source's local size (one per shard factor), that fixes its
  price: every distinct (H walk, L walk, size) that occurs is priced once, in numpy, with the very
  float operations ``_dtensor_steps`` performs, so both paths give bit-identical prices.
"""

from __future__ import annotations

import numpy as np

from autopar.cluster import Cluster
from autopar.layout import Mesh

# kind of a walk step (the order of ``_KINDS`` is the order ``np.select`` tests them)
NONE, TO_PARTIAL, SLICE, RS, AR, A2A, AG = range(7)
_MERGEABLE = (RS, AR, AG)  # DTensor flattens consecutive equal steps of these into one collective
_COLLECTIVE = {RS: "reduce-scatter", AR: "all-reduce", A2A: "all-to-all", AG: "all-gather"}


def _unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows, inv = np.unique(a, axis=0, return_inverse=True)
    return rows, np.ravel(inv)


def _half_walk(S: np.ndarray, D: np.ndarray, outside: np.ndarray, n_codes: int,
               boundary: str) -> tuple[np.ndarray, np.ndarray]:
    """The walk over one half of the axes, for K (src, dst) sub-row pairs, as one integer each.

    ``S``, ``D``: (K, w) codes of the half's axes in mesh order; ``outside``: (K,) bitmask of the
    codes the axes below this half shard differently. A pair's walk is, in walk order (last axis
    first), each step's kind and whether it has the same codes as the previous active step
    (``walk``, base 14: ``kind * 2 + same``), whether some axis cleared a nested shard, and the
    codes of its ``boundary`` ("first" or "last") active step. Returns ``(walk, tag)`` with ``tag``
    packing the walk, the cleared flag and the boundary codes: equal tags, equal halves.
    """
    K, w = S.shape
    walk = np.zeros(K, dtype=np.int64)
    cleared = np.zeros(K, dtype=bool)
    last_s, last_t = np.full(K, -1, dtype=np.int64), np.full(K, -1, dtype=np.int64)
    first_s, first_t = np.full(K, -1, dtype=np.int64), np.full(K, -1, dtype=np.int64)
    for m in reversed(range(w)):
        t = D[:, m].astype(np.int64)
        moved = ((outside >> t) & 1).astype(bool)
        for i in range(m):
            moved |= (S[:, i] == t) != (D[:, i] == t)
        clear = moved & (t >= 2)
        cleared |= clear
        t = np.where(clear, 0, t)
        src = S[:, m].astype(np.int64)
        kind = np.select([src == t, t == 1, src == 0, (src == 1) & (t >= 2), src == 1, t >= 2],
                         [NONE, TO_PARTIAL, SLICE, RS, AR, A2A], AG)
        active = kind != NONE
        walk = walk * 14 + kind * 2 + (active & (src == last_s) & (t == last_t))
        first = active & (first_s < 0)
        first_s[first], first_t[first] = src[first], t[first]
        last_s[active], last_t[active] = src[active], t[active]
    s, t = (first_s, first_t) if boundary == "first" else (last_s, last_t)
    tag = ((walk * 2 + cleared) * (n_codes + 1) + s + 1) * (n_codes + 1) + t + 1
    return walk, tag


def _number(walk: np.ndarray, tag: np.ndarray, n_codes: int) -> tuple[np.ndarray, dict]:
    """Number the distinct tags: an id per pair, and per id its walk, cleared flag, boundary codes."""
    tags, rep, ids = np.unique(tag, return_index=True, return_inverse=True)
    rest, t = np.divmod(tags, n_codes + 1)
    rest, s = np.divmod(rest, n_codes + 1)
    return np.ravel(ids), {"walk": walk[rep], "cleared": (rest % 2).astype(bool), "s": s - 1,
                           "t": t - 1}


def _decode(walks: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Base-14 walks of ``n`` steps -> (kinds, same-codes flags), one column per step in walk order."""
    digits = (walks[:, None] // 14 ** np.arange(n - 1, -1, -1, dtype=np.int64)[None, :]) % 14
    return digits // 2, (digits % 2).astype(bool)


def _walk_prices(kinds: np.ndarray, joins: np.ndarray, local: np.ndarray, walk_axes: list[int],
                 mesh: Mesh, cluster: Cluster) -> np.ndarray:
    """Seconds of each walk (rows of per-step kinds and joins, steps on ``walk_axes``).

    A step that has the same codes as the previous active one and is mergeable joins its group;
    a group is priced when the next one starts (or at the end), on the local bytes at that point,
    in the order and with the arithmetic of ``comm._dtensor_steps``.
    """
    from autopar.cost_models.comm import collective_time

    rows = len(kinds)
    local = np.asarray(local, dtype=float).copy()
    total = np.zeros(rows)
    level = mesh.level or (0,) * len(mesh.shape)
    pend = np.full(rows, NONE, dtype=np.int8)
    pend_p = np.ones(rows)
    pend_cross = np.zeros(rows, dtype=bool)

    def flush(ending: np.ndarray) -> None:
        ending = ending & (pend != NONE)
        if not ending.any():
            return
        bw = np.where(pend_cross, cluster.inter_bandwidth, cluster.intra_bandwidth)
        lat = np.where(pend_cross, cluster.inter_latency, cluster.intra_latency)
        sliced = ending & (pend == SLICE)
        local[sliced] /= pend_p[sliced]
        ag = ending & (pend == AG)
        local[ag] *= pend_p[ag]
        for kind, name in _COLLECTIVE.items():
            mask = ending & (pend == kind)
            if mask.any():
                total[mask] += collective_time(name, local[mask], pend_p[mask], bw[mask], lat[mask])
        rs = ending & (pend == RS)
        local[rs] /= pend_p[rs]
        pend[ending] = NONE

    for q, m in enumerate(walk_axes):
        k = kinds[:, q]
        active = k != NONE
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


def reprice_misaligned(out: np.ndarray, nbytes: float, s_codes: np.ndarray, d_codes: np.ndarray,
                       mesh: Mesh, cluster: Cluster) -> None:
    """Overwrite ``out[i, j]`` with DTensor's nested-order price where ``misaligned(s_codes[i],
    d_codes[j])``; other entries are left as they are."""
    n = len(mesh.shape)
    sharded = (s_codes >= 2).any(axis=1)
    if n < 2 or not sharded.any() or not len(d_codes):
        return
    h = n // 2
    n_codes = int(max(s_codes.max(), d_codes.max())) + 1
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

    # high half on every (src sub-row, dst sub-row, mask); low half on every (src, dst) sub-row pair
    a, b, c = (x.ravel() for x in np.meshgrid(np.arange(len(sH)), np.arange(len(dH)),
                                              np.arange(len(masks)), indexing="ij"))
    hid, high = _number(*_half_walk(sH[a], dH[b], masks[c], n_codes, "last"), n_codes)
    a, b = (x.ravel() for x in np.meshgrid(np.arange(len(sL)), np.arange(len(dL)), indexing="ij"))
    lid, low = _number(*_half_walk(sL[a], dL[b], np.zeros(len(a), dtype=np.int64), n_codes, "first"),
                       n_codes)
    # weight of the low walk's first active step's "same codes" digit (it may join the high half)
    kinds, _ = _decode(low["walk"], h)
    active = kinds != NONE
    low["first_w"] = np.where(active.any(axis=1),
                              14 ** (h - 1 - np.argmax(active, axis=1)).astype(np.int64), 0)

    # source classes: 0 unsharded (never misaligned), else 1 + index of its local size
    local = nbytes / np.prod(np.where(s_codes >= 2, np.asarray(mesh.shape, dtype=float), 1.0), axis=1)
    sizes, size_id = np.unique(local, return_inverse=True)
    cls = np.where(sharded, np.ravel(size_id) + 1, 0)
    n_high, n_low, n_cls = len(high["walk"]), len(low["walk"]), len(sizes) + 1
    if 14 ** n * n_cls >= 2**62:
        raise ValueError(f"a mesh of {n} axes is beyond the nested-order pricing (at most 14)")

    # every pair's (high walk, low walk, class), numbered densely: the only passes over the grid
    idx = np.int64 if n_high * n_low * n_cls >= 2**31 else np.int32
    hid = (hid.reshape(len(sH), len(dH), len(masks)) * (n_low * n_cls)).astype(idx)
    lid = (lid.reshape(len(sL), len(dL)) * n_cls).astype(idx)
    pair = hid[sH_id[:, None], dH_id[None, :], mask_id[sL_id[:, None], dL_id[None, :]]]
    pair += lid[sL_id[:, None], dL_id[None, :]]
    pair += cls[:, None].astype(idx)
    present = np.flatnonzero(np.bincount(pair.ravel(), minlength=n_high * n_low * n_cls))
    ph, rest = np.divmod(present, n_low * n_cls)
    pl, pc = np.divmod(rest, n_cls)
    mis = (high["cleared"][ph] | low["cleared"][pl]) & (pc > 0)
    if not mis.any():
        return
    ph, pl, pc = ph[mis], pl[mis], pc[mis]
    # the whole walk: the low half's first step joins the high half's last one when codes agree
    joined = (low["s"][pl] >= 0) & (low["s"][pl] == high["s"][ph]) & (low["t"][pl] == high["t"][ph])
    walk = high["walk"][ph] * 14 ** h + low["walk"][pl] + np.where(joined, low["first_w"][pl], 0)
    walks, which = np.unique(walk * n_cls + pc, return_inverse=True)
    kinds, joins = _decode(walks // n_cls, n)
    priced = _walk_prices(kinds, joins, sizes[walks % n_cls - 1], list(reversed(range(n))), mesh,
                          cluster)
    lut = np.full(n_high * n_low * n_cls, np.nan)
    lut[present[mis]] = priced[np.ravel(which)]
    new = lut[pair]
    np.copyto(out, new, where=~np.isnan(new))
