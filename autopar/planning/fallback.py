"""Which plan ``autopar.plan`` returns where both the flat exact search and the hierarchical one
may plan: the flat search's, unless memory binds it and the hierarchical space holds a faster
plan that fits, or it holds none that fits and the hierarchical space does.

The two spaces differ where memory binds. The flat space is one layout per node over the whole
mesh, a training option set per graph (ZeRO stage, recomputation, a step of 1, 2 or 4
microbatches: ``planning/options.py``) and, across nodes or when nothing fits, stage cuts of the
outer mesh axes at S, 2S or 4S microbatches (``planning/stages.py``). The hierarchical space
(``planning/hierarchical.py``) is coarser in layouts (uniform degrees per cluster level, one
tensor-group layout per block) and wider in what saves memory: any count of microbatches the batch
splits into, pipelines of any depth with their schedules and ZeRO and recomputation beside them.
Where memory does not bind the flat search, nothing the hierarchical space adds makes a step faster
(more microbatches run smaller batches more often, ``options.dominators``, and the flat path
searches pipelines across nodes itself), so only the flat search runs. Where it binds, the fastest
fitting plan may need 16 or 64 microbatches or a pipeline, which the flat space lacks, so the
hierarchical search runs too and the faster plan is returned (the flat one on a tie: it is exact over
its space); where the flat space holds no fitting plan, the hierarchical plan is returned instead
of ``InfeasibleError``. Either way the search line (``SearchInfo.path``) says what each path found.

Widening the flat space instead (more accumulation steps per option set) would cost a set of
tables and an exact DP per step count and ZeRO stage, and still lack the pipelines; the
hierarchical search solves each repeated block once and is bounded by the same time limit.
"""

from __future__ import annotations

from autopar.planning.plan import Plan

TIE = 1e-9  # relative: a hierarchical plan must be faster than this to replace the flat one


def summary(plan: Plan) -> str:
    """A plan in a few words for the search line: its step time and what it runs."""
    s = plan.strategy
    what = []
    if s is not None and s.degrees is not None:
        what.append(s.degrees.describe())
    if s is not None:
        what.append(s.options.describe())
    if plan.microbatches > 1 and not (s is not None and s.options.accumulate > 1):
        what.append(f"{plan.microbatches} microbatches")
    if plan.stages and len(plan.stages) > 1:
        what.append(f"{len(plan.stages)} pipeline stages")
    step = f"{plan.cost * 1e3:.4g} ms" if plan.cost < 1 else f"{plan.cost:.4g} s"
    return step + (f" ({'; '.join(what)})" if what else "")


def instead_of_infeasible(flat_error: Exception, hierarchical: Plan) -> Plan:
    """The hierarchical plan where the flat space holds none that fits; its search line says so."""
    reason = str(flat_error).split(" (")[0].split(";")[0]  # "no plan of M fits X GiB per device"
    hierarchical.search.path = "; ".join(filter(None, [
        f"hierarchical search: in the flat exact search's space {reason}; the hierarchical space "
        f"(any count of microbatches, pipelines) holds this one, {summary(hierarchical)}",
        hierarchical.search.path]))
    return hierarchical


def faster(flat: Plan, hierarchical: Plan | None, why_not: str = "") -> Plan:
    """The faster of the flat plan and the hierarchical one (None: none fits, ``why_not`` says
    why), with what each path found on the search line of the plan returned."""
    if hierarchical is not None and hierarchical.cost < flat.cost * (1 - TIE):
        hierarchical.search.path = "; ".join(filter(None, [
            f"hierarchical search: memory binds the flat exact search, whose best fitting plan is "
            f"{summary(flat)}; the hierarchical space's (any count of microbatches, pipelines) is faster: "
            f"{summary(hierarchical)}", hierarchical.search.path]))
        # the flat path's baselines the hierarchical one does not price (the expert plan) stay beside it
        hierarchical.baselines = {**flat.baselines, **hierarchical.baselines}
        return hierarchical
    found = (f"its best plan, {summary(hierarchical)}, is no faster" if hierarchical is not None
             else f"it found no fitting plan ({why_not})" if why_not else "it found no fitting plan")
    flat.search.path = "; ".join(filter(None, [
        flat.search.path, f"memory binds the flat exact search: the hierarchical search ran too and {found}"]))
    return flat

