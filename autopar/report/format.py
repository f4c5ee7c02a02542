"""Numbers and tables as text: units, byte sizes, aligned columns, and repeated blocks folded."""

from __future__ import annotations

import re

from autopar.core.margin import usable_memory

_BLOCK = re.compile(r"^(?P<prefix>.*?)\.(?P<idx>\d+)(?:\.(?P<rest>.*))?$")


def fmt_seconds(s: float) -> str:
    if s == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s:.3g} s"


def fmt_bytes(b: float | None) -> str:
    if b is None or b != b:  # unknown (None or NaN)
        return "?"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(b) >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


def cost_ratio(other: float, this: float) -> float:
    """``other / this``, where a zero ``this`` (a plan priced at nothing, e.g. a hand-edited plan
    file) gives inf or NaN, which ``speed_words`` calls not comparable, instead of raising."""
    if this == 0:
        return float("inf") if other else float("nan")
    return other / this


def speed_words(ratio: float) -> str:
    """'1.13x faster', '1.12x slower' or 'as fast' for ``ratio`` = other's cost / this one's: never
    '1x faster' (equal within the 3 digits shown) nor '0.889x faster' (a slow-down said as one)."""
    if not ratio > 0 or ratio != ratio or ratio == float("inf"):
        return "not comparable"
    big = max(ratio, 1 / ratio)
    if f"{big:.3g}" == "1":
        return "as fast (equal to 3 digits)"
    return f"{big:.3g}x {'faster' if ratio > 1 else 'slower'}"


def over_capacity(memory: float | None, capacity: float | None) -> str:
    """'does not fit (3.51 GiB > 1.3 GiB usable of 2 GiB)' when ``memory`` exceeds what a plan may
    use of a device of ``capacity`` bytes (``core/margin.py``: compile refuses more), else ''."""
    if not capacity or memory is None or memory != memory:
        return ""
    usable = usable_memory(capacity)
    if memory <= usable:
        return ""
    return f"does not fit ({fmt_bytes(memory)} > {fmt_bytes(max(usable, 0.0))} usable of {fmt_bytes(capacity)})"


def replicates_everything(plan) -> bool:
    """A single-stage plan on several devices that splits no node: every device runs the whole model."""
    return (plan.devices > 1 and not plan.stages and bool(plan.assignment)
            and all(all(s == 1 for s in c.splits) for c in plan.assignment.values()))


NO_PARALLELISM = "no parallelism: every device runs the whole model"


def units_of(plan):
    """The formatter for the plan's cost units (seconds, or e.g. PaSE's FLOP-equivalents)."""
    return fmt_seconds if plan.units == "s" else (lambda v: f"{v:.6g} {plan.units}")


def block_of(label: str) -> tuple[str, int] | None:
    """('blocks', 3) for 'blocks.3.attn.qkv': the repeated block a row belongs to, if any."""
    m = _BLOCK.match(label or "")
    return (m["prefix"], int(m["idx"])) if m else None


def _unindexed(cells: list[str]) -> list[str]:
    m = _BLOCK.match(cells[0])
    rest = m["rest"] if m else cells[0]
    return [rest or ""] + cells[1:]


def fold(rows: list[list[str]]) -> list[list[str]]:
    """Rows (first cell a module path) with runs of identical repeated blocks folded into one
    line: "blocks.1-47: same as blocks.0" (a fold line has an empty second cell)."""
    blocks = [block_of(r[0]) for r in rows]
    out: list[list[str]] = []
    i = 0
    while i < len(rows):
        if blocks[i] is None:
            out.append(rows[i])
            i += 1
            continue
        prefix, first = blocks[i]
        j = i
        while j < len(rows) and blocks[j] == (prefix, first):
            j += 1
        body = rows[i:j]
        key = [_unindexed(x) for x in body]
        k, last = j, first
        while True:
            nxt = k + len(body)
            if (nxt <= len(rows) and all(b == (prefix, last + 1) for b in blocks[k:nxt])
                    and [_unindexed(x) for x in rows[k:nxt]] == key):
                k, last = nxt, last + 1
            else:
                break
        out.extend(body)
        if last > first:
            span = f"{first + 1}" if last == first + 1 else f"{first + 1}-{last}"
            out.append([f"{prefix}.{span}: same as {prefix}.{first}"] + [""] * (len(body[0]) - 1))
        i = k
    return out


def table(rows: list[list[str]], header: list[str]) -> list[str]:
    """Aligned columns; a fold line (empty second cell) spans the table."""
    widths = [max(len(r[c]) for r in [header] + [r for r in rows if r[1] or c == 0])
              for c in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    for r in rows:
        if not r[1]:
            lines.append("  " + r[0])
        else:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return lines


NODE_HEADER = ["module", "op", "split", "param placements", "output placements", "compute", "comm", "memory"]
PLACEMENT_KEY = "S(i) shard tensor axis i, R replicate, P partial sum"


def node_cells(rows, fmt) -> list[list[str]]:
    return [[r.module, r.op + ("*" if r.replicated_why else ""), r.split, r.params, r.outputs,
             fmt(r.compute), fmt(r.comm), fmt_bytes(r.memory)] for r in rows]
