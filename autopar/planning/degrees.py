"""The hierarchical search space: degrees per cluster level, and pins that fix some of them.

A candidate plan splits every level of the cluster (in-node, across nodes, across pods; sizes
``Cluster.levels()``) into tensor x pipeline x data degrees, ordered factorisations of the level's
size. Restrictions, stated: the tensor group stays inside a pod (no tensor parallelism over the
data-centre network) and has at most ``max_tensor`` devices (its layouts are found by the flat
exact DP, which is used up to 64 devices); the pipeline has at most as many stages as the model
has units (blocks, plus prologue and epilogue); a tensor group that crosses nodes takes whole
nodes (``tensor[0]`` is the node size when ``tensor[1] > 1``: fewer devices per node on the fast
link and more on the slow one is never the better group, and keeping it out spares the search
the tensor DPs of those groups).

``Pin`` fixes what a published plan states (``tensor=8 pipeline=64 data=6``, optionally
``zero=1``, ``recompute=1`` (``recompute=attention``: attention-only; ``recompute=every-2``: every
2nd block), ``microbatch=1``, ``context=16`` (``ring=1``: its attention as a ring, ``ring=0``: K/V
gathered; else both priced), ``expert=8``, ``schedule=interleaved-1f1b``); the rest is searched
under the same cost model, the pipeline schedule included unless the pin names one. A context
degree, pinned or searched (for causal language models: ``context.context_options``), is carved out
of the data-parallel degrees, innermost level first (``with_context``: the sequence's ranks sit
next to the tensor group, where the keys' and values' gathers are cheapest).

Expert parallelism (models with routed experts): the expert group is part of the data-parallel
devices and fills them innermost level first (``expert_options``): an expert group on the slower
link while faster data-parallel devices stay outside it is never the better group for its
all-to-all, and keeping it out keeps the space small.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, fields

from autopar.core.schedules import SCHEDULES
from autopar.core.strategy import RECOMPUTE_ATTENTION, RECOMPUTE_POINTWISE, Degrees


def divisors(n: int) -> list[int]:
    small = [k for k in range(1, int(math.isqrt(n)) + 1) if n % k == 0]
    return sorted(set(small + [n // k for k in small]))


def triples(n: int) -> list[tuple[int, int, int]]:
    """Ordered (a, b, c) with a * b * c == n."""
    return [(a, b, n // (a * b)) for a in divisors(n) for b in divisors(n // a)]


def level_degrees(levels: list[int], max_tensor: int = 64, max_pipeline: int | None = None) -> list[Degrees]:
    """Every ``Degrees`` over ``levels`` within the space's restrictions."""
    per_level = []
    for lvl, size in enumerate(levels):
        opts = [(t, p, d) for t, p, d in triples(size) if not (lvl >= 2 and t > 1)]
        per_level.append(opts)
    out = []
    for combo in itertools.product(*per_level):
        t = math.prod(c[0] for c in combo)
        p = math.prod(c[1] for c in combo)
        if t > max_tensor or (max_pipeline is not None and p > max_pipeline):
            continue
        if len(combo) > 1 and combo[1][0] > 1 and combo[0][0] != levels[0]:
            continue
        out.append(Degrees(tuple(c[0] for c in combo), tuple(c[1] for c in combo), tuple(c[2] for c in combo)))
    return out


def expert_options(data: tuple[int, ...], experts: int) -> list[tuple[int, ...]]:
    """Expert degrees per level for ``data`` (empty tuple: none), each group size dividing the
    number of ``experts``: levels below the outermost one it spans are taken whole."""
    out: list[tuple[int, ...]] = [()]
    for lvl, size in enumerate(data):
        inner = math.prod(data[:lvl])
        for k in divisors(size):
            if k > 1 and experts % (inner * k) == 0:
                out.append(tuple(data[:lvl]) + (k,) + (1,) * (len(data) - lvl - 1))
    return out


@dataclass(frozen=True)
class Pin:
    """Totals a plan must have (None: searched)."""

    tensor: int | None = None
    pipeline: int | None = None
    data: int | None = None
    zero: int | None = None
    recompute: bool | str | int | None = None  # or RECOMPUTE_ATTENTION, or k: every k-th block
    microbatch: int | None = None  # sequences per microbatch
    zero_inner: bool | None = None  # ZeRO over the data parallelism inside a pod only
    context: int | None = None  # ranks each sequence is split over (context parallelism)
    expert: int | None = None  # devices the routed experts are split over (of the data devices)
    schedule: str | None = None  # a pipeline schedule (step_price.SCHEDULES); None: searched
    ring: bool | None = None  # context parallelism as a ring (True) or K/V all-gathers (False); None: searched

    def admits(self, deg: Degrees) -> bool:
        return ((self.tensor is None or deg.t == self.tensor) and (self.pipeline is None or deg.p == self.pipeline)
                and (self.data is None or deg.d == self.data) and deg.c == (self.context or 1)
                and (self.expert is None or deg.ep == self.expert) and (self.ring is None or deg.ring == self.ring))

    def describe(self) -> str:
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name) is not None)


def with_context(deg: Degrees, context: int) -> Degrees | None:
    """``deg`` with ``context`` ranks taken out of its data degrees, innermost level first; None
    when the data degrees do not factor that way (each level gives gcd(what is left, its data))."""
    if context <= 1:
        return deg
    left, ctx, data = context, [], []
    for k in deg.data:
        g = math.gcd(left, k)
        ctx.append(g)
        data.append(k // g)
        left //= g
    if left != 1:
        return None
    return Degrees(deg.tensor, deg.pipeline, tuple(data), tuple(ctx))


_KEYS = {"tensor": int, "pipeline": int, "data": int, "zero": int, "microbatch": int, "context": int, "expert": int,
         "schedule": str,
         "recompute": lambda v: recompute_value(v),
         "zero_inner": lambda v: v.lower() in ("1", "true", "yes", "on"),
         "ring": lambda v: v.lower() in ("1", "true", "yes", "on")}


RECOMPUTE_VALUES = "none, full, attention, pointwise or every-K (K >= 2: every K-th block)"


def recompute_value(text: str) -> bool | str | int:
    """A recomputation as written (a pin's ``recompute=``, the command line's ``--recompute``):
    none / off / 0 -> False, full / on / 1 -> True (every block), attention -> attention-only,
    pointwise -> every block's pointwise ops (matmul and attention outputs kept),
    every-K or K >= 2 -> K (every K-th block, ``planning/every.py``); ValueError otherwise."""
    v = str(text).strip().lower()
    if v in ("none", "off", "0", "false", "no"):
        return False
    if v in ("full", "on", "1", "true", "yes"):
        return True
    if v in (RECOMPUTE_ATTENTION, RECOMPUTE_POINTWISE):
        return v
    k = v[len("every-"):] if v.startswith("every-") else v
    if k.isdigit() and int(k) >= 1:
        return int(k) if int(k) >= 2 else True
    raise ValueError(f"recompute {text!r}: write {RECOMPUTE_VALUES}")


def parse_pin(text: str | Pin | None) -> Pin | None:
    """'tensor=8,pipeline=64,data=6' (commas or spaces) -> Pin; ValueError names what is wrong."""
    if text is None or isinstance(text, Pin):
        return text
    values = {}
    for part in text.replace(",", " ").split():
        key, _, val = part.partition("=")
        if key not in _KEYS or not val:
            raise ValueError(f"pin {part!r}: write key=value with key one of {', '.join(_KEYS)} "
                             "(e.g. tensor=8,pipeline=64,data=6)")
        try:
            values[key] = _KEYS[key](val)
        except ValueError as e:
            why = str(e) if key == "recompute" else f"{val!r} is not a number"
            raise ValueError(f"pin {part!r}: {why}") from None
    if not values:
        raise ValueError("empty pin: write e.g. tensor=8,pipeline=64,data=6")
    if values.get("expert", 1) < 1:
        raise ValueError(f"pin expert={values['expert']}: the expert degree is a device count >= 1 "
                         "(e.g. tensor=8,expert=8,pipeline=16,data=16)")
    return Pin(**values)


def pin_schedules(pin: Pin) -> tuple[str, ...]:
    """The pipeline schedules a pinned plan searches: the pin's own, or every one."""
    if pin.schedule is None:
        return tuple(SCHEDULES)
    if pin.schedule not in SCHEDULES:
        raise ValueError(f"pin schedule={pin.schedule}: write one of {', '.join(SCHEDULES)}")
    return (pin.schedule,)
