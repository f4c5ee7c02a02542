"""The report of a hierarchical plan: degrees and options beside the baselines', predicted
utilisation beside a published one, the step and memory term by term, and why they differ.

Everything comes from the plans' ``strategy`` records (made by ``planning/hierarchical.py`` with
one cost model for all of them), so a saved plan prints the same report.
"""

from __future__ import annotations

from autopar.core.margin import usable_memory
from autopar.report.format import cost_ratio, fmt_bytes, fmt_seconds, over_capacity, speed_words

# why a term differs, in words (filled with the two plans' numbers)
_WHY = {
    "compute": "compute: {a} vs {b} (the slowest stage's work x microbatches; recomputation adds a forward)",
    "pipeline bubble": "pipeline bubble: {a} vs {b} ((p - 1) / m = {bub_a:.1%} vs {bub_b:.1%} of the "
                       "microbatches)",
    "pipeline send/recv": "pipeline send/recv: {a} vs {b} (activations between stages over {pa} vs {pb} links)",
    "gradient sync inside the tensor group": "gradient sync inside the tensor group: {a} vs {b}",
    "optimizer step": "optimizer step: {a} vs {b} (on the ZeRO shard of the fullest stage)",
}


def _level(deg, which) -> str:
    per = getattr(deg, which)
    levels = [l for l, k in enumerate(per) if k > 1]
    if not levels:
        return "no"
    return ("in-node", "inter-node", "inter-pod")[min(levels[-1], 2)]


def _row(name: str, plan, capacity: float | None) -> list[str]:
    s = plan.strategy
    d = s.degrees
    fits = over_capacity(plan.memory_per_device, capacity) or "yes"
    options = s.options.describe()
    if s.options.zero and s.zero_axes:
        group = 1
        for a in s.zero_axes:
            group *= plan.mesh.shape[a]
        if group < d.d:
            options = options.replace(f"ZeRO-{s.options.zero}", f"ZeRO-{s.options.zero} over {group} of the {d.d} "
                                      "data-parallel devices")
    return [name, d.describe(), options, f"{s.microbatch_size} x {plan.microbatches}",
            fmt_seconds(plan.cost), f"{s.mfu(plan.cost, plan.devices):.1%}", f"{s.hfu(plan.cost, plan.devices):.1%}",
            fmt_bytes(plan.memory_per_device), fits]


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return [fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]


def calibration_lines(plan) -> list[str]:
    """Predicted utilisation of a published plan beside the figure its paper reports."""
    out = []
    for name, b in plan.baselines.items():
        ref = b.strategy.reference if b.strategy else {}
        if not ref:
            continue
        hw = ref.get("measure") == "hardware"
        pred = b.strategy.hfu(b.cost, b.devices) if hw else b.strategy.mfu(b.cost, b.devices)
        ratio = pred / ref["utilisation"]
        what = "hardware FLOPs, recomputation counted" if hw else "model FLOPs (MFU)"
        out.append(f"{name} as reported: {ref['utilisation']:.1%} of peak ({what}; {ref['figure']}; "
                   f"{ref['source']}); predicted for it here: {pred:.1%} ({ratio:.2f}x the reported figure)")
    return out


def why_lines(plan, other, name: str) -> list[str]:
    """The terms of the step where ``other`` costs more than ``plan`` (largest first), and memory."""
    a, b = plan.strategy, other.strategy
    capacity = plan.cluster.get("memory_capacity")
    out = []
    if capacity and other.memory_per_device > usable_memory(capacity):
        out.append(f"memory: {name} needs {fmt_bytes(other.memory_per_device)} per device, more than the "
                   f"{fmt_bytes(max(usable_memory(capacity), 0.0))} a plan may use of {fmt_bytes(capacity)}; autopar's plan needs {fmt_bytes(plan.memory_per_device)}")
    diffs = []
    for term in sorted(set(a.time_terms) | set(b.time_terms)):
        ta, tb = a.time_terms.get(term, 0.0), b.time_terms.get(term, 0.0)
        diffs.append((tb - ta, term, ta, tb))
    diffs.sort(reverse=True)
    da, db = a.degrees, b.degrees
    for delta, term, ta, tb in diffs:
        if abs(delta) <= 0.005 * other.cost:
            continue
        if term.startswith("data-parallel sync"):
            text = (f"data-parallel sync: {fmt_seconds(ta)} vs {fmt_seconds(tb)} (data degree {da.d} vs {db.d}, "
                    f"{a.options.describe().split(',')[0]} vs {b.options.describe().split(',')[0]}, over "
                    f"{_level(da, 'data')} vs {_level(db, 'data')} links)")
        elif term == "tensor-parallel communication":
            why = (f"tensor degree {da.t} on {_level(da, 'tensor')} links vs {db.t} on {_level(db, 'tensor')}"
                   if (da.t, _level(da, "tensor")) != (db.t, _level(db, "tensor")) else
                   f"the same tensor degree {da.t}: the slowest stage's blocks x microbatches")
            text = f"tensor-parallel collectives: {fmt_seconds(ta)} vs {fmt_seconds(tb)} ({why})"
        else:
            text = _WHY.get(term, term + ": {a} vs {b}").format(
                a=fmt_seconds(ta), b=fmt_seconds(tb), pa=_level(da, "pipeline"), pb=_level(db, "pipeline"),
                bub_a=(da.p - 1) / max(plan.microbatches, 1), bub_b=(db.p - 1) / max(other.microbatches, 1))
        out.append(("+ " if delta > 0 else "- ") + text)
    return out


def format_scale_report(plan) -> str:
    c = plan.cluster
    s = plan.strategy
    capacity = c.get("memory_capacity")
    lines = [
        f"autopar plan for {plan.model_name} on {c.get('name', '?')}: {plan.devices} devices; cost model "
        f"{plan.cost_model}, hierarchical search (degrees per cluster level)",
        f"search: {plan.search.name} in {plan.search.seconds:.3g} s, {plan.search.describe()}",
        "",
    ]
    rows = [_row("autopar", plan, capacity)] + [_row(n.replace("_", " "), b, capacity)
                                                 for n, b in plan.baselines.items() if b.strategy]
    lines += _table(rows, ["plan", "degrees", "options", "microbatch", "step", "MFU", "HFU", "memory", "fits"])
    lines += ["", "MFU: model FLOPs (forward + backward) / (step x devices x peak at "
              f"{s.options.precision}); HFU also counts the recomputed forward"]
    lines += calibration_lines(plan)
    plans = [("autopar", plan)] + [(n.replace("_", " "), b) for n, b in plan.baselines.items() if b.strategy]
    terms = list(dict.fromkeys(t for _, p in plans for t in p.strategy.time_terms))
    lines += ["", "step time per term:"]
    lines += _table([[t] + [fmt_seconds(p.strategy.time_terms.get(t, 0.0)) for _, p in plans] for t in terms],
                    ["term"] + [n for n, _ in plans])
    mem = list(dict.fromkeys(t for _, p in plans for t in p.strategy.memory_terms))
    lines += ["", "memory per device (the fullest stage):"]
    lines += _table([[t] + [fmt_bytes(p.strategy.memory_terms.get(t, 0.0)) for _, p in plans] for t in mem],
                    ["term"] + [n for n, _ in plans])
    for name, b in plan.baselines.items():
        if not b.strategy:
            continue
        misfit = over_capacity(b.memory_per_device, capacity)  # it would not run: no speed-up against it
        lines += ["", f"why autopar's plan differs from {name.replace('_', ' ')} ({fmt_seconds(b.cost)} -> "
                      f"{fmt_seconds(plan.cost)}, " + (f"but {name.replace('_', ' ')} {misfit}" if misfit else
                      f"autopar is {speed_words(cost_ratio(b.cost, plan.cost))}") + "):"]
        lines += ["  " + w for w in why_lines(plan, b, name.replace("_", " "))] or ["  (no term differs by more than 0.5%)"]
        if b.strategy.notes and plan.strategy.notes:
            lines += [f"  autopar's {plan.strategy.notes[0]}", f"  {name.replace('_', ' ')}'s {b.strategy.notes[0]}"]
    if s.recompute:
        lines += ["", f"recomputed blocks: {s.recompute[0]} ... {s.recompute[-1]} ({len(s.recompute)})"]
    if s.options.zero:
        lines += [f"ZeRO-{s.options.zero} shards over mesh axes {list(s.zero_axes)} of mesh {plan.mesh.shape}"]
    lines += ["notes: " + "; ".join(s.notes)] if s.notes else []
    lines += ["cluster: " + _describe(c)]
    return "\n".join(lines)


def _describe(c: dict) -> str:
    return (f"{c.get('devices')} devices, {c.get('devices_per_node')} per node; memory {fmt_bytes(c.get('memory_capacity', 0))}; "
            f"links {c.get('intra_bandwidth', 0) / 1e9:.4g} GB/s in a node, {c.get('inter_bandwidth', 0) / 1e9:.4g} GB/s "
            f"between nodes (achievable, per device and direction); compute at "
            f"{c.get('compute_efficiency') or 'the model default'} of peak")
