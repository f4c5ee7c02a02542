"""The pipeline part of a report: the step formula, the bubble, one line per stage, then each
stage's nodes on its devices, per microbatch, as the planner priced them (``plan.stage_rows``)."""

from __future__ import annotations

from autopar.core.schedules import rounds
from autopar.report.format import NODE_HEADER, PLACEMENT_KEY, fmt_bytes, fold, node_cells, table

STAGE_HEADER = ["stage", "nodes", "first .. last", "devices", "per microbatch", "compute", "comm", "send/recv",
                "sync+update/step", "memory/device", "holds"]


def step_numbers(plan) -> dict[str, float]:
    """slots (M + S - 1), the slowest stage's time, the slowest sync, the step and the bubble."""
    times = [s.cost for s in plan.stages]
    syncs = [s.sync for s in plan.stages]
    slots = rounds(plan.schedule, plan.microbatches, len(plan.stages))
    busy = sum(plan.microbatches * t for t in times)
    return {"slots": slots, "bottleneck": max(times), "sync": max(syncs),
            "step": slots * max(times) + max(syncs), "bubble": (slots - plan.microbatches) / slots,
            "idle": 1.0 - busy / (len(plan.stages) * slots * max(times)) if max(times) > 0 else 0.0}


def pipeline_lines(plan, units) -> list[str]:
    s_count, m = len(plan.stages), plan.microbatches
    batch = plan.batch
    lines = [f"pipeline: {s_count} stages x {plan.stages[0].devices} devices, {m} microbatches"
             + (f" of {batch // m} (batch {batch})" if batch and batch % m == 0 else "")
             + f", schedule {plan.schedule}"]
    if plan.schedule == "1f1b" and m < s_count:  # what codegen.pipeline.schedule_run does with it
        lines.append(f"  1F1B with fewer microbatches than stages ({m} < {s_count}) runs in GPipe's order: every "
                     f"stage does its {m} forward(s) before its backwards, and holds all {m} (priced so)")
    n = step_numbers(plan)
    slow = max(range(s_count), key=lambda k: plan.stages[k].cost)
    sync = max(range(s_count), key=lambda k: plan.stages[k].sync)
    if n["slots"] == m + s_count - 1:  # GPipe, 1F1B
        slots, fill = ("(M + S - 1) x slowest stage", f"({m} + {s_count} - 1)"), "(S - 1)/(M + S - 1)"
        counted = f"{s_count - 1}/{n['slots']}"
    else:  # a smaller bubble (zero bubble: a third of 1F1B's)
        frac = (n["slots"] - m) / (s_count - 1)
        slots = (f"(M + {frac:.3g}(S - 1)) x slowest stage", f"({m} + {frac:.3g} x {s_count - 1})")
        fill, counted = f"{frac:.3g}(S - 1)/(M + {frac:.3g}(S - 1))", f"{n['slots'] - m:.3g}/{n['slots']:.3g}"
    lines.append(f"  step = {slots[0]} + slowest sync and update = {slots[1]} x "
                 f"{units(n['bottleneck'])} (stage {slow}) + {units(n['sync'])} (stage {sync}) = "
                 f"{units(n['step'])}")
    lines.append(f"  bubble (fill and drain, {plan.schedule}): {fill} = {counted} = "
                 f"{n['bubble']:.1%} of the pipelined time; idle with stage imbalance: {n['idle']:.1%}")
    if not plan.stage_rows:  # an older plan file: the stages' own figures only
        for k, st in enumerate(plan.stages):
            lines.append(f"  stage {k}: {st.nodes[0]} .. {st.nodes[-1]} ({len(st.nodes)} nodes), "
                         f"devices {k * st.devices}-{(k + 1) * st.devices - 1}, "
                         f"{units(st.cost)} per microbatch, grad sync and optimizer update {units(st.sync)} per step"
                         + (f", {fmt_bytes(st.memory)}/device" if st.memory is not None else ""))
        return lines
    rows = []
    for s in plan.stage_rows:
        first, last = plan.stages[s.index].nodes[0], plan.stages[s.index].nodes[-1]
        rows.append([str(s.index), f"{s.first}-{s.last}", f"{first} .. {last}",
                     f"{s.devices[0]}-{s.devices[1] - 1}", units(s.time), units(s.compute), units(s.comm),
                     units(s.send_recv), units(s.sync), fmt_bytes(s.memory), f"{s.in_flight} mb"])
    lines += ["  " + x for x in table(rows, STAGE_HEADER)]
    lines.append("")
    lines.append(f"per stage, its nodes on the stage's {plan.stages[0].devices} devices "
                 f"(mesh {plan.stage_mesh}), per microbatch (1 of {m}):")
    for s in plan.stage_rows:
        lines.append("")
        lines.append(f"stage {s.index}: nodes {s.first}-{s.last}, devices {s.devices[0]}-{s.devices[1] - 1}; "
                     f"{units(s.time)} per microbatch = compute {units(s.compute)} + comm {units(s.comm)}"
                     f" + send/recv {units(s.send_recv)}; grad sync {units(s.sync)} once per step")
        lines += table(fold(node_cells(s.nodes, units)), NODE_HEADER)
    lines.append(f"placements per axis of the stage's mesh: {PLACEMENT_KEY}; comm includes resharding the "
                 "node's inputs; memory holds the stage's in-flight microbatches")
    return lines
