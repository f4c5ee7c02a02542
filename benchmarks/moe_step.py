"""Expert parallelism beside data parallelism, measured: one training step of the zoo's mixture of
experts on local gloo processes, in one run.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.moe_step [--nproc 4] [--steps 10] [--warmup 2] [--no-write]

On ``nproc`` gloo processes (one thread each), the zoo ``moe`` model (sizes in ``SIZES``) compiled
under three plans: ``data_parallel`` (autopar's data-parallel baseline: every rank holds every
expert and all-reduces their gradients), ``expert_parallel`` (the same plan with each
``moe_experts`` node's experts split over all ranks: each rank holds ``experts / nproc`` of them,
the tokens travel to their experts and back by all-to-all) and ``autopar`` (autopar's own plan
for the ``cpu`` cluster of ``nproc`` devices); and the first two again for the same model with its
experts written as an ``nn.ModuleList`` of modules (``moe(listed=True)``, rows marked "listed"),
which expert parallelism stores split as well: the table gives the bytes of expert weights each
rank holds. A step is forward + backward + AdamW, fenced by
barriers; the variants are timed in turns (``runtime._round_robin``) and each figure is the median
of ``steps`` rounds after ``warmup``, on rank 0, beside the plan's predicted step. Results go to
``benchmarks/moe_step.md``. Beside the ``cpu`` preset's prediction, the profiled model's
(``ProfiledModel``, links fitted on this group, the all-to-all's included) of the same plans.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "moe_step.md"
NOTE = ("Two predictions of the same plans. The ``cpu`` preset's (alpha-beta figures of gloo's ring "
        "all-reduce: 1 GB/s, 0.9 ms a step, 1.15 ms a call) is the search's objective: it charges each of the "
        "experts' six all-to-alls a call and three ring steps of latency and ranks data parallelism before "
        "expert parallelism. The profiled model prices the same assignments on links fitted on this group "
        "(``cost_models/collective_fit.py``: the all-reduce, the all-gather and the all-to-all, each timed "
        "as a step meets it), the expert ids' and the rows' all-to-alls, which follow the row counts' with no "
        "compute between, on the fit after a short gap; its order is the measured one. The box is shared "
        "with other work (load about 18 on the benchmark machine): the figures move from run to run, the ratios within a "
        "run are what to compare.")
SIZES = dict(batch=8, seq=64, width=128, hidden=512, experts=8, top_k=2, layers=2, classes=16)


def _expert_parallel(plan):
    """``plan`` with every experts node's experts over the whole mesh (the rest as it was)."""
    from autopar.core.tables import Config

    assignment = dict(plan.assignment)
    everything = tuple(range(len(plan.mesh.shape)))
    for node in plan.graph.nodes:
        if node.op == "moe_experts":
            names = [d.name for d in node.dims]
            assignment[node.name] = Config(tuple(math.prod(plan.mesh.shape) if d == "experts" else 1 for d in names),
                                           tuple(everything if d == "experts" else () for d in names))
    return dataclasses.replace(plan, assignment=assignment, baselines={})


def _held(module) -> int:
    """Bytes of expert weights this rank stores (another rank's experts of a list: freed)."""
    return sum(p._local_tensor.untyped_storage().nbytes() for n, p in module.named_parameters() if ".experts." in n)


def worker(rank: int, world: int, steps: int, warmup: int) -> dict:
    import torch

    import autopar
    from benchmarks.runtime import _round_robin

    torch.manual_seed(0)
    model, inputs = autopar.zoo.get("moe", **SIZES)
    best = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=world), pipeline=False)
    dp = best.baselines["data_parallel"]
    listed, listed_inputs = autopar.zoo.get("moe", **SIZES, listed=True)
    listed_dp = autopar.plan(listed, listed_inputs, autopar.Cluster.preset("cpu", devices=world),
                             pipeline=False).baselines["data_parallel"]
    plans = {"data_parallel": (dp, model, inputs), "expert_parallel": (_expert_parallel(dp), model, inputs),
             "autopar": (best, model, inputs), "data_parallel, listed": (listed_dp, listed, listed_inputs),
             "expert_parallel, listed": (_expert_parallel(listed_dp), listed, listed_inputs)}
    from autopar.planning.breakdown import choice_of

    from autopar.cost_models.profiled import ProfiledModel
    from autopar.cost_models.tables import build_tables

    cluster = autopar.Cluster.preset("cpu", devices=world)
    profiled = ProfiledModel(optimizer="adam")  # the links fitted on this group, all-to-all included
    profiled.profile(best.graph, cluster, progress=False)
    live = build_tables(best.graph, cluster, profiled, space="mesh", mode="train", optimizer="adam")
    profiled.profile(listed_dp.graph, cluster, progress=False)
    live_listed = build_tables(listed_dp.graph, cluster, profiled, space="mesh", mode="train", optimizer="adam")
    steps_of, predicted, fitted, held = {}, {}, {}, {}
    for label, (plan, model, inputs) in plans.items():
        tables, fit = (listed_dp.tables, live_listed) if "listed" in label else (best.tables, live)
        module = autopar.compile(model, inputs, plan=plan)
        held[label] = _held(module)
        opt = torch.optim.AdamW(module.parameters(), lr=1e-3, foreach=True)

        def step(module=module, opt=opt):
            opt.zero_grad(set_to_none=True)
            module(*inputs).backward()
            opt.step()

        steps_of[label] = step
        predicted[label] = tables.total(choice_of(tables, plan.assignment))  # the search's objective
        fitted[label] = fit.total(choice_of(fit, plan.assignment))
    medians, _ = _round_robin(steps_of, steps, warmup)
    experts = [n for n in best.graph.nodes if n.op == "moe_experts"]
    chosen = [dict(zip([d.name for d in n.dims], best.assignment[n.name].splits)) for n in experts]
    c = profiled.comm
    links = (f"all-reduce {c.latency * 1e6:.0f} us a step, {c.bandwidth / 1e9:.2g} GB/s; all-to-all "
             f"{c.all_to_all_latency * 1e6:.0f} us a step, {c.all_to_all_bandwidth / 1e9:.2g} GB/s") if c else "none"
    return {"measured": medians, "predicted": predicted, "profiled": fitted, "autopar_experts": chosen,
            "links": links, "held": held}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from autopar.runtime.launch import launch

    out = launch(worker, args.nproc, args.steps, args.warmup)[0]
    lines = [f"zoo moe {SIZES} on {args.nproc} gloo processes (OMP_NUM_THREADS=1); median of {args.steps} "
             f"steps after {args.warmup} warm-up, variants in turns", "",
             "| plan | measured step | measured / data parallel | predicted, cpu preset | predicted, profiled "
             "on this group | profiled / data parallel | expert weights held per rank |",
             "|---|---|---|---|---|---|---|"]
    base, fit_base = out["measured"]["data_parallel"], out["profiled"]["data_parallel"]
    for label, seconds in out["measured"].items():
        lines.append(f"| {label} | {seconds * 1e3:.1f} ms | {seconds / base:.2f} | {out['predicted'][label] * 1e3:.2f} ms"
                     f" | {out['profiled'][label] * 1e3:.2f} ms | {out['profiled'][label] / fit_base:.2f}"
                     f" | {out['held'][label] / 2 ** 20:.2f} MiB |")
    lines += ["", f"links fitted on the group (rank 0): {out['links']}"]
    lines += ["", f"autopar's own plan splits its experts nodes as {out['autopar_experts']}", "", NOTE]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        RESULTS.write_text("# Expert parallelism beside data parallelism, measured\n\n"
                           "    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.moe_step --nproc "
                           f"{args.nproc} --steps {args.steps} --warmup {args.warmup}\n\n{text}\n")


if __name__ == "__main__":
    main()
