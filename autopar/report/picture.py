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
    "sequence": "#55a868",
    "reduction": "#c44e52",
    "mixed": "#8172b3",
}
COMM = "#303030"


SCALES = ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns"))
MAX_LABELS = 80  # node names on the x axis; beyond this every k-th node is named


def _title(plan) -> str:
    from autopar.report.format import NO_PARALLELISM, cost_ratio, replicates_everything, speed_words, units_of

    units = units_of(plan)
    head = f"{plan.model_name} on {plan.cluster.get('name', '?')}: {units(plan.cost)} per step"
    if replicates_everything(plan):
        head += f" ({NO_PARALLELISM})"
    elif "data_parallel" in plan.baselines:
        head += f" ({speed_words(cost_ratio(plan.baselines['data_parallel'].cost, plan.cost))} than data parallel)"
    return head


def seconds_scale(total: float) -> tuple[float, str]:
    """The unit the title prints ``total`` in (fmt_seconds'), for the y axis to read the same."""
    return next(((f, u) for f, u in SCALES if abs(total) >= f), SCALES[-1])


def node_label(row) -> str:
    """What a bar is called on the x axis: the module path and its op, e.g. 'blocks.0.fc1 linear'."""
    label = row.module if row.module == row.name or row.op in row.module else f"{row.module} {row.op}"
    return label if len(label) <= 32 else "..." + label[-29:]


def _bars(plan, ax):
    from matplotlib.patches import Patch

    nums = plan.rows
    colors = [KINDS[r.split_kind] for r in nums]
    if plan.units == "s":
        scale, name = seconds_scale(plan.cost)
        unit = f"{name}, as in the title"
    else:
        scale, unit = 1.0, (f"{plan.units}, PaSE's FLOP-equivalents" if plan.cost_model == "pase" else plan.units)
    x = range(len(nums))
    compute = [v.compute / scale for v in nums]
    ax.bar(x, compute, color=colors, width=0.8, linewidth=0)
    ax.bar(x, [v.comm / scale for v in nums], bottom=compute, color=COMM, alpha=0.75, width=0.8, linewidth=0)
    step = max(1, -(-len(nums) // MAX_LABELS))
    ax.set_xticks(list(x)[::step])
    ax.set_xticklabels([node_label(r) for r in nums][::step], rotation=90, fontsize=7)
    ax.set_xlim(-0.6, len(nums) - 0.4)
    ax.set_xlabel("node, in execution order" + (f" (every {step}th named)" if step > 1 else ""))
    ax.set_ylabel(f"predicted per step\n({unit})", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
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
    scale, unit = next(((f, u) for f, u in SCALES if slot * (m + s_count) >= f), SCALES[-1])
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
    import matplotlib.pyplot as plt

    fig = figure(plan)
    path = Path(path)
    fig.savefig(path, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    return path


def figure(plan):
    """The matplotlib figure ``draw`` saves (its axes are what a test reads)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not plan.rows and not plan.stages:
        raise ValueError("this plan has no per-node rows to draw (saved by an older autopar): plan the model again")
    if plan.stages:
        fig, ax = plt.subplots(figsize=(12, 1.2 + 0.7 * len(plan.stages)))
        _timeline(plan, ax)
    else:
        n = min(len(plan.rows), MAX_LABELS)
        fig, ax = plt.subplots(figsize=(max(8.0, min(3 + 0.16 * n, 40)), 7))
        _bars(plan, ax)
    fig.suptitle(_title(plan), fontsize=10)
    fig.tight_layout()
    return fig
