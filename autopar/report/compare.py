"""``autopar compare``: data parallel, the expert plan and autopar's side by side.

A plan over the devices' memory is marked "does not fit (X GiB > Y GiB)" and gets no speed-up: it
would not run, so autopar is not "faster" than it; when data parallel itself does not fit, no plan
is compared with it. Speed-ups are words ("1.13x faster", "1.12x slower"), never "0.889x".
"""

from __future__ import annotations

from autopar.report.format import NO_PARALLELISM, fmt_bytes, over_capacity, replicates_everything, speed_words, units_of


def compare_lines(plan) -> list[str]:
    fmt = units_of(plan)
    capacity = None if plan.cost_model == "pase" else plan.cluster.get("memory_capacity")
    rows = [(name.replace("_", " "), b) for name, b in plan.baselines.items()] + [("autopar", plan)]
    dp = plan.baselines.get("data_parallel")
    dp_misfit = over_capacity(dp.memory_per_device, capacity) if dp is not None else ""
    cells = []
    for name, p in rows:
        misfit = over_capacity(p.memory_per_device, capacity)
        if misfit:
            vs = misfit
        elif dp is None or dp_misfit:
            vs = "-"
        elif p is dp:
            vs = "(the reference)"
        else:
            vs = speed_words(dp.cost / p.cost)
        cells.append([name, fmt(p.cost), fmt_bytes(p.memory_per_device), vs])
    head = ["plan", "step time", "memory/device", "vs data parallel"]
    widths = [max(len(r[c]) for r in cells + [head]) for c in range(4)]
    lines = [f"{plan.model_name} on {plan.cluster.get('name', '?')} ({plan.devices} devices), cost model "
             f"{plan.cost_model}" + (f", {fmt_bytes(capacity)} per device" if capacity else "")]
    for r in [head] + cells:
        lines.append(f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}".rstrip())
    if dp_misfit:
        lines.append(f"data parallel {dp_misfit}: no plan is compared with it")
    if replicates_everything(plan):
        lines.append(f"autopar: {NO_PARALLELISM} (no node is split)")
    lines += [f"autopar: {n}" for n in plan.notices]
    return lines
