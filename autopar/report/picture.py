"""A picture of a plan, rendered with matplotlib's Agg backend (no display).

* A single-stage plan: one bar per node in execution order, compute coloured by the kind of split
  the node got, its communication (gradient sync, resharding its inputs) stacked on top in grey.
  For a deep model that is more readable than a drawn DAG: the repeated blocks show up as a
  repeating pattern, and where the time goes is visible at a glance. PaSE's plans are drawn the
  same way over PaSE's nodes, in its FLOP-equivalent units.
* A pipelined plan: a timeline of one step per device group (stage): each microbatch's forward and
  backward in its slot of the slowest stage's length, the fill-and-drain bubbles left empty, then
  the gradient sync; the step model of ``search.pipeline`` (``(M + S - 1)`` slots + the slowest
  sync), drawn, not a simulation of 1F1B's interleaving.
"""

from __future__ import annotations

from pathlib import Path

KINDS = {
    "replicated": "#b0b0b0",
    "data": "#4c72b0",
    "tensor": "#dd8452",
    "reduction": "#c44e52",
    "mixed": "#8172b3",
}
COMM = "#303030"


def _title(plan) -> str:
    from autopar.report.format import units_of

    units = units_of(plan)
    head = f"{plan.model_name} on {plan.cluster.get('name', '?')}: {units(plan.cost)}"
    if "data_parallel" in plan.baselines:
        head += f" ({plan.baselines['data_parallel'].cost / plan.cost:.2f}x over data parallel)"
    return head


def _bars(plan, ax):
    from matplotlib.patches import Patch

    nums = plan.rows
    colors = [KINDS[r.split_kind] for r in nums]
    unit = (f"{plan.units}, PaSE's FLOP-equivalents" if plan.cost_model == "pase"
            else "seconds" if plan.units == "s" else plan.units)
    x = range(len(nums))
    compute = [v.compute for v in nums]
    ax.bar(x, compute, color=colors, width=1.0, linewidth=0)
    ax.bar(x, [v.comm for v in nums], bottom=compute, color=COMM, alpha=0.75, width=1.0, linewidth=0)
    ax.set_xlabel("node (execution order)")
    ax.set_ylabel(f"predicted per step\n({unit})", fontsize=9)
    handles = [Patch(color=c, label=f"compute, {k}") for k, c in KINDS.items()]
    handles.append(Patch(color=COMM, alpha=0.75, label="communication"))
    ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=8, ncol=3,
              frameon=False)
    return len(nums)


def _timeline(plan, ax):
    from matplotlib.patches import Patch

    from autopar.report.format import fmt_seconds

    s_count, m = len(plan.stages), plan.microbatches
    if plan.stage_rows:
        times = [s.time for s in plan.stage_rows]
        syncs = [s.sync for s in plan.stage_rows]
        sends = [s.send_recv for s in plan.stage_rows]
    else:  # an older plan file: its stage times only
        times = [s.cost for s in plan.stages]
        syncs = [0.0] * s_count
        sends = [0.0] * s_count
    slot = max(times)
    scale, unit = next(((f, u) for f, u in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns"))
                        if slot * (m + s_count) >= f), (1e-9, "ns"))
    for k in range(s_count):
        y = s_count - 1 - k
        for j in range(m):
            start = (k + j) * slot
            work = times[k] - sends[k]
            ax.broken_barh([(start / scale, work / scale)], (y - 0.4, 0.8), facecolors=KINDS["data"],
                           edgecolors="white", linewidth=0.5)
            if sends[k] > 0:
                ax.broken_barh([((start + work) / scale, sends[k] / scale)], (y - 0.4, 0.8), facecolors=COMM,
                               alpha=0.75)
        end = (m + s_count - 1) * slot
        if syncs[k] > 0:
            ax.broken_barh([(end / scale, syncs[k] / scale)], (y - 0.4, 0.8), facecolors=KINDS["reduction"])
    ax.set_yticks(range(s_count))
    per = plan.stages[0].devices
    labels = [f"stage {k}\ndevices {k * per}-{(k + 1) * per - 1}" for k in reversed(range(s_count))]
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlim(0, ((m + s_count - 1) * slot + max(syncs)) / scale * 1.02)
    bubble = (s_count - 1) / (m + s_count - 1)
    ax.set_xlabel(f"time in one step ({unit}); {plan.schedule}, {m} microbatches, slot = slowest stage per "
                  f"microbatch = {fmt_seconds(slot)}; bubble (S-1)/(M+S-1) = {bubble:.0%}")
    ax.legend(handles=[Patch(color=KINDS["data"], label="microbatch forward+backward"),
                       Patch(color=COMM, alpha=0.75, label="send/recv at the cuts"),
                       Patch(color=KINDS["reduction"], label="gradient sync"),
                       Patch(facecolor="white", edgecolor="#b0b0b0", label="idle (bubble)")],
              loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=8, ncol=4, frameon=False)


def draw(plan, path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not plan.rows and not plan.stages:
        raise ValueError("this plan has no per-node rows to draw (saved by an older autopar): plan the model again")
    if plan.stages:
        fig, ax = plt.subplots(figsize=(12, 1.2 + 0.7 * len(plan.stages)))
        _timeline(plan, ax)
    else:
        n = len(plan.rows)
        fig, ax = plt.subplots(figsize=(max(8.0, min(4 + 0.08 * n, 40)), 5))
        _bars(plan, ax)
    fig.suptitle(_title(plan), fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    return path
