"""The report of a many-model plan: what was fused and why, each job's options and choice, the
two schedules' makespans beside the lower bound and one-model-at-a-time practice, and a
per-device timeline."""

from __future__ import annotations

from autopar.report import timeline
from autopar.report.table import fmt_seconds


def rows(plan, schedule=None) -> list[timeline.Row]:
    schedule = schedule or plan.joint
    return [(d, s.start, s.end, plan.jobs[s.job].name) for s in schedule.slots for d in s.devices]


def report(plan) -> str:
    lines = [f"{len(plan.names)} models on {plan.devices} devices ({plan.cluster}), {plan.steps} steps each in "
             f"{plan.units} units; cost model {plan.cost_model}, multi-device options priced as "
             f"{'data parallelism (DDP on a process subgroup)' if plan.parallel == 'ddp' else 'autopar plans'}"]
    if plan.fusion:
        lines.append("")
        lines.append("fusion (one device, priced by the cost model):")
        for members, choice in plan.fusion:
            who = ", ".join(plan.names[i] for i in members)
            sizes = "  ".join(f"k={p.k}: {fmt_seconds(p.total_seconds)}" + ("" if p.fits else " (does not fit)")
                              for p in choice.prices)
            lines.append(f"  {who}: {choice.why}")
            lines.append(f"    per step of all {choice.models}: {sizes}")
    lines.append("")
    lines.append("jobs (one step on each device count it can run on; * the joint schedule's choice):")
    chosen = plan.joint.options()
    for j, job in enumerate(plan.jobs):
        opts = ", ".join(f"{'*' if i == chosen[j] else ''}{o.devices} ({o.kind}) {fmt_seconds(o.step_seconds)}"
                         for i, o in enumerate(job.options))
        lines.append(f"  {job.name}: {opts}")
        if job.shards is not None:
            lines.append(f"    shards: {job.shards.describe()}")
    work, chain = plan.bound
    lines.append("")
    lines.append(f"lower bound: {fmt_seconds(max(work, chain))} (total work / devices {fmt_seconds(work)}, "
                 f"longest job {fmt_seconds(chain)})")
    for label, sched in (("Sharded-LRTF (Hydra's scheduler)", plan.lrtf), ("joint CP-SAT (autopar)", plan.joint)):
        extra = f", CP-SAT {sched.status} in {sched.seconds:.2g} s" if "CP-SAT" in sched.method else ""
        lines.append(f"{label:<36} makespan {fmt_seconds(sched.makespan):>10}  "
                     f"{sched.makespan / plan.lower_bound:.3f}x the lower bound{extra}")
    for label, seconds in plan.baselines.items():
        lines.append(f"{label[:60]:<60} {fmt_seconds(seconds):>10}  "
                     f"{seconds / plan.joint.makespan:.2f}x autopar's makespan")
    lines.append("")
    lines.append("timeline (joint schedule):")
    lines.append(timeline.text(rows(plan), plan.devices))
    return "\n".join(lines)


def draw(plan, path: str) -> None:
    title = (f"{len(plan.names)} models on {plan.devices} devices: makespan {fmt_seconds(plan.joint.makespan)} "
             f"(lower bound {fmt_seconds(plan.lower_bound)}, Sharded-LRTF {fmt_seconds(plan.lrtf.makespan)})")
    timeline.draw(rows(plan), plan.devices, path, title)
