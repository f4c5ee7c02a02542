"""``plan.report()``: what autopar chose, why, what it costs, and what it gains over hand plans.

Everything printed comes from the plan itself (its rows, stages and baselines, made by the
planner with the plan's own tables and cost model), so a plan read from a file, or on any rank,
prints the same report. One row per node, runs of identical repeated blocks folded; a pipelined
plan per stage (``pipeline.py``); a PaSE plan over PaSE's nodes in its units (``pase.py``).
"""

from __future__ import annotations

from autopar.core.margin import memory_margin, usable_memory
from autopar.report.pase import pase_lines
from autopar.report.pipeline import pipeline_lines
from autopar.report.format import (NO_PARALLELISM, NODE_HEADER, PLACEMENT_KEY, cost_ratio, fmt_bytes, fmt_seconds, fold,
                                   node_cells, over_capacity, replicates_everything, speed_words, table, units_of)


def capacity_words(predicted: float, capacity: float) -> str:
    """' of CAPACITY (margin Z)': what the device holds and what of it a plan may not use
    (``core/margin.py``), and when the plan needs more than the rest, that compile refuses it."""
    words = f" of {fmt_bytes(capacity)} (margin {fmt_bytes(memory_margin(capacity))})"
    if predicted > usable_memory(capacity):
        words += f": over the {fmt_bytes(max(usable_memory(capacity), 0.0))} a plan may use, compile refuses it"
    return words


def header_lines(plan) -> list[str]:
    c = plan.cluster
    units = units_of(plan)
    lines = [
        f"autopar plan for {plan.model_name} on {c.get('name', '?')}: {plan.devices} devices, "
        f"mesh {plan.mesh.shape} (levels {plan.mesh.level}); cost model {plan.cost_model}, "
        f"space {plan.space}, mode {plan.mode}",
        f"search: {plan.search.name} in {plan.search.seconds:.3g} s, " + plan.search.describe(),
    ]
    if plan.cost_model == "pase":
        r = plan.pase_rate
        lines.append(f"predicted cost: {units(plan.cost)} (PaSE's FLOP-equivalent units: FLOPs plus r x words moved"
                     + (f", r = {r:.6g} FLOP per 8-byte word" if r else "")
                     + "); memory is not modelled by PaSE's cost model")
    else:
        lines.append(f"predicted step time: {units(plan.cost)}; memory per device: "
                     f"{fmt_bytes(plan.memory_per_device)}"
                     + (capacity_words(plan.memory_per_device, c["memory_capacity"]) if c.get("memory_capacity") else ""))
    alone = replicates_everything(plan)
    if alone:
        lines.append(NO_PARALLELISM + " (no node is split)")
    lines += [f"  {n}" for n in plan.notices]
    capacity = None if plan.cost_model == "pase" else c.get("memory_capacity")
    for name, b in plan.baselines.items():
        misfit = over_capacity(b.memory_per_device, capacity)
        line = (f"  vs {name.replace('_', ' ')}: {units(b.cost)}"
                + ("" if plan.cost_model == "pase" else f", {fmt_bytes(b.memory_per_device)}/device"))
        if misfit:  # it would not run: no speed-up against it
            line += f": {misfit}"
        elif alone:
            line += f" -> the whole model on each device is {speed_words(cost_ratio(b.cost, plan.cost))}"
        else:
            line += f" -> autopar is {speed_words(cost_ratio(b.cost, plan.cost))}"
        lines.append(line)
    return lines


def format_report(plan, explain: bool = False) -> str:
    units = units_of(plan)
    lines = header_lines(plan)
    if plan.stages:
        lines += pipeline_lines(plan, units)
    lines.append("")
    if plan.stages and plan.stage_rows:
        pass  # the stages' node tables are part of pipeline_lines
    elif plan.cost_model == "pase" and plan.rows:
        lines += pase_lines(plan)
    elif plan.rows:
        lines += table(fold(node_cells(plan.rows, fmt_seconds)), NODE_HEADER)
        lines.append(f"placements per mesh axis: {PLACEMENT_KEY}; comm includes resharding the node's inputs"
                     + ("; compute measured on the local machine" if plan.cost_model == "profiled" else ""))
        if any(r.op == "moe_experts" and "experts/" in r.split for r in plan.rows):  # cost_models/experts.py
            lines.append("experts/N: uniform routing assumed (each expert receives tokens x top-k / experts; "
                         "no load imbalance); tokens exchanged by all-to-all, no capacity factor")
    else:
        lines += generic_rows(plan)
    if plan.unsupported:
        lines.append("")
        lines.append(f"replicated (* above; no split rule): {len(plan.unsupported)} node(s)")
        for n, why in plan.unsupported.items():
            lines.append(f"  {n}: {why}")
    if explain:
        lines.append("")
        if plan.explanation:
            lines.append("the arithmetic (every term of the predicted step time):")
            lines += plan.explanation
        else:
            lines.append("no arithmetic recorded: plan with explain=True (autopar plan --explain) "
                         "and the analytic model of a single-stage plan")
    return "\n".join(lines)


def generic_rows(plan) -> list[str]:
    """For a plan without rows (a file from an older autopar): node and config only."""
    rows = [[str(name), str(cfg.splits)] for name, cfg in plan.assignment.items()]
    return table(rows, ["node", "config (splits per dim)"]) + [
        "(no per-node costs in this plan file: it was saved by an older autopar; re-plan for them)"]
