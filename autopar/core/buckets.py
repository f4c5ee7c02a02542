"""How gradient all-reduces are grouped into buckets: one rule, read by the runtime that issues
them (``codegen.runtime.GradReducer``) and by the cost model that prices them.

Parameters whose gradients are summed over the same mesh axes share buckets of at most
``BUCKET_BYTES`` (DDP's default ``bucket_cap_mb=25``), filled from the last parameter the forward
reads back to the first, the order in which the backward produces their gradients. (Reducing
each large gradient alone, in place, was measured slower: 190 vs 145 ms a step of the runtime
benchmark's residual MLP on 2 gloo processes; fewer, larger collectives win on gloo.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

BUCKET_BYTES = 25 * 2**20


@dataclass
class Bucket:
    axes: tuple[int, ...]  # the mesh axes its all-reduce runs over
    names: list[str] = field(default_factory=list)
    nbytes: float = 0.0  # per device


def make_buckets(params: list[tuple[str, tuple[int, ...], float]], cap: float = BUCKET_BYTES,
                 units: list[str] | None = None) -> list[Bucket]:
    """``params``: (name, reduction axes, bytes per device) in the order the forward first reads
    them; those with no axes need no reduction and are left out. ``units`` (one per parameter):
    a bucket holds one unit's parameters only (ZeRO-3 gathers and frees a block's buckets
    together, as ``fully_shard`` on each block does)."""
    buckets: list[Bucket] = []
    open_: dict[tuple[int, ...], Bucket] = {}
    unit_of: dict[int, str] = {}
    for i, (name, axes, nbytes) in reversed(list(enumerate(params))):
        if not axes:
            continue
        b = open_.get(axes)
        unit = units[i] if units is not None else None
        if b is None or (b.names and b.nbytes + nbytes > cap) or unit_of.get(id(b)) != unit:
            b = Bucket(tuple(axes))
            buckets.append(b)
            open_[axes] = b
            unit_of[id(b)] = unit
        b.names.append(name)
        b.nbytes += nbytes
    return buckets
