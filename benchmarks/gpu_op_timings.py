"""The profiled cost model's op timings on this machine's GPU for one rank of a saved plan:

    python -m benchmarks.gpu_op_timings MODEL PLAN.json [--rank R] [--device cuda]

Every node the rank runs (a pipelined plan: its stage's) at the rank's local shapes, forward and
backward, timed by ``ProfiledModel(device=...)`` (cached by device name, as ``autopar plan
--cost-model profiled`` caches the CPU's); printed: the sum beside the analytic compute the plan
was priced with (its rows), the ops the runner could not run, and the ten slowest ops.
``benchmarks/gpu_check.py`` runs it after ``autopar measure`` on the same plan.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("plan")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    from autopar.cli.model_spec import load_call
    from autopar.cost_models.profiled import ProfiledModel
    from autopar.frontend.trace import trace
    from autopar.planning.plan import Plan

    model, inputs, kwargs, _ = load_call(args.model)
    plan = Plan.load(args.plan, mode="train")
    graph = trace(model, tuple(inputs), kwargs or None, progress=False)
    names = {n.name for n in graph.nodes}
    if plan.stages:
        names = set(plan.stages[args.rank // int(plan.stages[0].devices)].nodes)
    profiled = ProfiledModel(device=args.device, fit_comm=False)
    total, failed, per = 0.0, [], []
    for node in graph.nodes:
        cfg = plan.assignment.get(node.name)
        if node.name not in names or cfg is None:
            continue
        t = profiled.timing(node, cfg)
        if t.forward is None:
            failed.append(f"{node.name} ({t.error[:60]})")
            continue
        seconds = t.forward + (t.backward or 0.0)
        total += seconds
        per.append((seconds, node.name, node.op))
    analytic = sum(r.compute for r in plan.rows if r.name in names) if plan.rows else float("nan")
    print(f"{len(per)} ops timed on {args.device} ({profiled.measurements} measured now, the rest cached); "
          f"{len(failed)} not runnable{': ' + ', '.join(failed[:5]) if failed else ''}")
    print("slowest: " + "; ".join(f"{n} ({op}) {s * 1e3:.2f} ms" for s, n, op in sorted(per, reverse=True)[:10]))
    print(f"forward + backward of rank {args.rank}'s ops, profiled on {args.device}: {total * 1e3:.1f} ms; "
          f"the plan's compute terms ({plan.cost_model}): {analytic * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
