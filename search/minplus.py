"""The DP's one numeric kernel: min over one variable of a sum of tables, in bounded memory.

Eliminating v from factors f_1..f_m (each a table over a few variables, v among them) gives the
message  M[U] = min_v sum_j f_j[S_j]  over U = (S_1 | ... | S_m) - {v}. Two cases dominate:
a sum of two pairwise tables is a min-plus matrix product, and the biggest steps of the
Transformer sum a few 2- and 3-variable tables over ~1000-config nodes (10^8 to 10^9 terms).

So: tables whose variables are a subset of another table's are folded into it first (cheap: the
size of that table), the remaining tables are added by broadcasting into a scratch tile with v on
the last (contiguous) axis, and the tile is min-reduced along it. Tiles are chunks of the leading
output axes, sized to stay in cache (512 KiB) whatever the size of the full sum, so the memory the
kernel needs is the message plus one tile. Everything stays float64: the DP is exact and argmins
of near-equal float32 sums could pick a worse plan.

No argmin tables are kept: back-substitution re-derives v's best config from the same factors at
the already-chosen values of U, which costs one vector of length |v| per node.
"""

from __future__ import annotations

import math

import numpy as np

# float64 elements per scratch tile (512 KiB): the tile and the rows it sums stay in a core's
# L2 (2 MiB here, shared with the other process on it); 2 MiB tiles spilled and made the
# min-plus steps of a 48-layer GPT on 64 devices ~20% slower (1.83 s vs 2.27 s, same plans).
TILE_ELEMENTS = 1 << 16
SMALL_DOMAIN = 16  # below this many configs of v, loop over v instead of reducing a short axis


def _aligned(table: np.ndarray, scope: tuple[int, ...], full: tuple[int, ...]) -> np.ndarray:
    """``table`` with its axes in the order of ``full`` and size-1 axes for missing variables."""
    pos = {w: i for i, w in enumerate(full)}
    perm = sorted(range(len(scope)), key=lambda a: pos[scope[a]])
    # A contiguous copy in the new axis order: the broadcast adds then stream every part along
    # v (the last axis); a transposed view would stride across rows there (5x slower).
    arr = np.ascontiguousarray(table.transpose(perm)) if perm != list(range(len(scope))) else table
    shape = [1] * len(full)
    for a in perm:
        shape[pos[scope[a]]] = table.shape[a]
    return arr.reshape(shape)


def _fold(parts: list[tuple[np.ndarray, frozenset[int]]]) -> list[np.ndarray]:
    """Add every table into one whose variables contain its own; never writes into an input."""
    parts = sorted(parts, key=lambda p: (-p[0].size, -len(p[1])))
    kept: list[list] = []  # [array, vars, owned]
    for arr, vars_ in parts:
        for k in kept:
            if vars_ <= k[1]:
                k[0] = k[0] + arr if not k[2] else np.add(k[0], arr, out=k[0])
                k[2] = True
                break
        else:
            kept.append([arr, vars_, False])
    return [k[0] for k in kept]


def _min_into(parts: list[np.ndarray], out: np.ndarray, scratch: np.ndarray) -> None:
    """out[...] = min over the last axis of sum(parts); parts broadcast to out.shape + (kv,)."""
    kv = max(p.shape[-1] for p in parts)
    rows = out.shape[0] if out.ndim else 1
    per_row = (out.size // rows if out.ndim else 1) * kv
    if out.ndim == 0 or out.size * kv <= scratch.size:
        tmp = scratch[: out.size * kv].reshape(out.shape + (kv,))
        np.add(parts[0], parts[1], out=tmp)
        for p in parts[2:]:
            np.add(tmp, p, out=tmp)
        np.min(tmp, axis=-1, out=out)
    elif per_row <= scratch.size:
        step = scratch.size // per_row
        for s in range(0, rows, step):
            sl = slice(s, s + step)
            _min_into([p[sl] if p.shape[0] > 1 else p for p in parts], out[sl], scratch)
    else:
        for s in range(rows):
            _min_into([p[s] if p.shape[0] > 1 else p[0] for p in parts], out[s], scratch)


def _min_over_v_loop(parts: list[np.ndarray], out: np.ndarray) -> None:
    """The same reduction for a small domain of v: one output-sized sum per config of v."""
    kv = max(p.shape[-1] for p in parts)
    tmp = np.empty_like(out)
    out.fill(np.inf)
    for c in range(kv):
        sl = [p[..., c if p.shape[-1] > 1 else 0] for p in parts]
        np.add(sl[0], sl[1], out=tmp)
        for p in sl[2:]:
            np.add(tmp, p, out=tmp)
        np.minimum(out, tmp, out=out)


def eliminate(factors: list[tuple[np.ndarray, tuple[int, ...]]], v: int,
              out_scope: tuple[int, ...], scratch: np.ndarray | None = None) -> np.ndarray:
    """min over v of the sum of ``factors`` (table, variables); axes of the result = out_scope."""
    full = tuple(out_scope) + (v,)
    parts = _fold([(_aligned(t, s, full), frozenset(s)) for t, s in factors])
    if len(parts) == 1:
        return parts[0].min(axis=-1)
    out_shape = tuple(max(p.shape[a] for p in parts) for a in range(len(out_scope)))
    out = np.empty(out_shape)
    kv = max(p.shape[-1] for p in parts)
    if kv < SMALL_DOMAIN and out.size >= 64:
        _min_over_v_loop(parts, out)
    else:
        if scratch is None or scratch.size < min(TILE_ELEMENTS, out.size * kv):
            scratch = np.empty(max(TILE_ELEMENTS, kv))
        _min_into(parts, out, scratch)
    return out


def best_config(factors: list[tuple[np.ndarray, tuple[int, ...]]], v: int,
                chosen: dict[int, int], size: int) -> int:
    """argmin over v of the factors with every other variable fixed (lowest index on ties)."""
    vec = np.zeros(size)
    for table, scope in factors:
        vec = vec + table[tuple(slice(None) if w == v else chosen[w] for w in scope)]
    return int(np.argmin(vec))


def table_elements(sizes: tuple[int, ...], scope: tuple[int, ...]) -> int:
    return math.prod(sizes[w] for w in scope)
