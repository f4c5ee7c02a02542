"""Many models at once: fusion measured on the local CPU against autopar's choice, and the
schedules of many models on simulated GPUs against their lower bound and common practice.

    .venv/bin/python -m benchmarks.many_models [--rounds 7] [--only fusion|scheduling] [--no-write]

Fusion: for mlp, cnn and gpt (the zoo's default sizes) at K = 4 and 16 models, one training step
of all K (forward, backward, AdamW with a learning rate per model) is timed three ways on one
thread: one by one (torch.optim.AdamW per model), fused (``autopar.fuse`` + ``FusedAdamW``) and
PyTorch's ensembling path (``torch.func.stack_module_state`` + ``vmap`` over ``functional_call``,
the same FusedAdamW on the stacked parameters; batch norm under vmap needs
``replace_all_batch_norm_modules_``, which stops tracking running statistics). The three run
interleaved, one step each per round, after two warm-up steps; the table gives medians over the
rounds. autopar's choice is ``choose_fusion`` (profiled cost model, priced before any of the
timing) between one by one and fused by K, with its full choice over groups beside it.

Scheduling: 16 GPTs of 4 sizes (4 learning rates each; two sizes do not fit one 32 GB V100 with
Adam) on a simulated 8xV100, 1000 steps each in 4 units, planned by ``plan_many`` (analytic
model, autopar plans per device count, shards by the memory model); then the same jobs in more
mixes and device counts. Each case: the lower bound, Sharded-LRTF and the joint CP-SAT
makespans, and one model at a time (Hydra's model-parallel baseline, and autopar's own best
plan on all devices). Results: ``benchmarks/many_models.md`` and a timeline picture.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "many_models.md"
PICTURE = HERE / "many_models_timeline.png"
LRS = (1e-3, 2e-3, 4e-3, 8e-3)


# -- fusion on the local CPU -------------------------------------------------------------------------

def _runners(name: str, k: int, device: str = "cpu"):
    import torch
    from torch.func import functional_call, stack_module_state, vmap

    import autopar
    from autopar.fusion import FusedAdamW, fuse

    models = [autopar.zoo.get(name, seed=s)[0].to(device) for s in range(k)]
    inputs = tuple(x.to(device) for x in autopar.zoo.get(name)[1])
    lrs = [LRS[i % len(LRS)] for i in range(k)]
    alone = [copy.deepcopy(m) for m in models]
    opts = [torch.optim.AdamW(m.parameters(), lr=lr) for m, lr in zip(alone, lrs)]

    def one_by_one():
        for m, o in zip(alone, opts):
            o.zero_grad()
            m(*inputs).backward()
            o.step()

    fused = fuse([copy.deepcopy(m) for m in models], inputs)
    fopt = FusedAdamW(fused.parameters(), k, lr=lrs)

    def fused_step():
        fopt.zero_grad()
        fused(*inputs).sum().backward()
        fopt.step()

    base = copy.deepcopy(models[0]).to("meta")
    if name == "cnn":
        torch.func.replace_all_batch_norm_modules_(base)
    params, buffers = stack_module_state([copy.deepcopy(m) for m in models])
    if name == "cnn":
        buffers = {}
    vopt = FusedAdamW(list(params.values()), k, lr=lrs)

    def call(p, b, *xs):
        return functional_call(base, (p, b), xs)

    def vmap_step():
        vopt.zero_grad()
        vmap(call, in_dims=(0, 0) + (None,) * len(inputs))(params, buffers, *inputs).sum().backward()
        vopt.step()

    return models, inputs, {"one by one": one_by_one, "fused (autopar.fuse)": fused_step, "vmap": vmap_step}


def fusion_case(name: str, k: int, rounds: int, device: str = "cpu") -> dict:
    import torch

    from autopar.core.cluster import Cluster
    from autopar.planning.fusion_choice import choose_fusion

    torch.set_num_threads(1)
    models, inputs, runners = _runners(name, k, device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    start = time.perf_counter()
    one = Cluster.preset("cpu", devices=1) if device == "cpu" else Cluster.preset("8xH100").with_devices(1)
    pair = choose_fusion(models, inputs, one, sizes=[1, k], device=device)
    full = choose_fusion(models, inputs, one, device=device)
    priced = time.perf_counter() - start
    times = {label: [] for label in runners}
    for run in runners.values():
        run()
        run()
    for _ in range(rounds):
        for label, run in runners.items():
            sync()
            t = time.perf_counter()
            run()
            sync()
            times[label].append(time.perf_counter() - t)
    med = {label: statistics.median(ts) for label, ts in times.items()}
    faster_fused = med["fused (autopar.fuse)"] < med["one by one"]
    return dict(name=name, k=k, medians=med, choice=pair.k, full=full.k, predicted=(pair.price(1).total_seconds,
                pair.price(k).total_seconds), right=(pair.k == k) == faster_fused, seconds=priced)


# -- scheduling on simulated GPUs ------------------------------------------------------------------------

ARCHS = (dict(layers=12, width=768, heads=12), dict(layers=24, width=1024, heads=16),
         dict(layers=24, width=2048, heads=16), dict(layers=32, width=2560, heads=20))


def scheduling(time_limit: float) -> tuple[object, list[dict]]:
    import autopar
    from autopar.core.cluster import Cluster
    from autopar.planning.many import plan_many, to_jobs
    from autopar.search.joint import joint
    from autopar.search.schedule import lower_bound, lrtf, validate

    cluster = Cluster.preset("8xV100")
    models, inputs, names = [], [], []
    for a, arch in enumerate(ARCHS):
        for lr in LRS:
            m, x = autopar.zoo.get("gpt", seq=1024, batch=8, vocab=32000, device="meta", seed=a, **arch)
            models.append(m)
            inputs.append(x)
            names.append(f"gpt{arch['width']}x{arch['layers']} lr={lr:g}")
    start = time.perf_counter()
    plan = plan_many(models, inputs, cluster, steps=1000, units=4, fuse=False, names=names, time_limit=time_limit)
    planned = time.perf_counter() - start
    cases = [dict(case="16 GPTs of 4 sizes on 8 devices (the main case)", devices=8, models=16,
                  lb=plan.lower_bound, lrtf=plan.lrtf.makespan, joint=plan.joint.makespan, status=plan.joint.status,
                  baselines=plan.baselines, seconds=planned)]
    by_arch = [plan.jobs[4 * a:4 * a + 4] for a in range(len(ARCHS))]
    for label, per_arch, devices in (("8 GPTs (2 per size) on 8 devices", 2, 8), ("4 GPTs (1 per size) on 8 devices", 1, 8),
                                     ("32 GPTs (8 per size) on 8 devices", 8, 8), ("16 GPTs on 4 devices", 4, 4)):
        jobs = []
        for group in by_arch:
            for i in range(per_arch):
                j = dataclasses.replace(group[i % 4], name=f"{group[0].name.split()[0]} #{i}")
                j.options = [o for o in j.options if o.devices <= devices]
                jobs.append(j)
        sched = to_jobs(jobs, plan.steps, plan.units)
        base = lrtf(sched, devices)
        best = joint(sched, devices, time_limit=time_limit, hint=base)
        validate(sched, base)
        validate(sched, best)
        cases.append(dict(case=label, devices=devices, models=len(jobs), lb=max(lower_bound(sched, devices)),
                          lrtf=base.makespan, joint=best.makespan, status=best.status, baselines={}, seconds=best.seconds))
    return plan, cases


# -- the report ---------------------------------------------------------------------------------------------

def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g} ms"


def write(fusion: list[dict], plan, cases: list[dict], rounds: int, path: Path, device: str = "cpu") -> str:
    flag = "" if device == "cpu" else f" --device {device}"
    lines = [f"# Many models at once (generated by `python -m benchmarks.many_models{flag}`)", ""]
    if fusion:
        right = sum(r["right"] for r in fusion)
        where = "the CPU (one thread)" if device == "cpu" else f"{device} ({_gpu_name()})"
        lines += [f"## Fusion on {where}", "",
                  f"One training step of all K models (forward, backward, AdamW with a learning rate per model), "
                  f"medians of {rounds} interleaved rounds after 2 warm-up steps, wall clock, "
                  + ("one process on the benchmark machine (benchmarks/README.md). " if device == "cpu" else
                     "the device synchronized before and after each step. ")
                  + "autopar's choice is the profiled cost model's "
                  "(`choose_fusion`, priced before the timing) between one by one and fused by K; "
                  "`groups` is its choice when groups of 2, 4, ... are allowed too.", "",
                  "| model | K | one by one | fused (autopar.fuse) | vmap (torch.func) | fused speed-up | "
                  "predicted one by one / fused | autopar's choice | groups | right? |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in fusion:
            m = r["medians"]
            one, fused = m["one by one"], m["fused (autopar.fuse)"]
            p1, pk = r["predicted"]
            lines.append(f"| {r['name']} | {r['k']} | {_ms(one)} | {_ms(fused)} | {_ms(m['vmap'])} | "
                         f"{one / fused:.2f}x | {_ms(p1)} / {_ms(pk)} | {'fused' if r['choice'] == r['k'] else 'one by one'} | "
                         f"{r['full']} | {'yes' if r['right'] else 'NO'} |")
        lines += ["", f"autopar chose the faster of the two in **{right} of {len(fusion)}** cases "
                  f"(target: at least 5 of 6).", ""]
    if cases:
        main = cases[0]
        sizes = ", ".join(f"{a['layers']}x{a['width']}" for a in ARCHS)
        lines += ["## Scheduling many models (simulated 8xV100, 32 GB)", "",
                  f"GPTs with sequence 1024, batch 8, vocabulary 32000, Adam; sizes (layers x width) "
                  f"{sizes}, 4 learning rates each, "
                  f"{plan.steps} steps per model in {plan.units} units. Options per model: autopar's plan on 1, 2, 4, "
                  "8 devices (analytic model), and shards by the memory model (with prefetch) where no plan fits "
                  f"one device. Planning all 16 took {main['seconds']:.0f} s (tracing, plans, CP-SAT).", "",
                  "| case | models | devices | lower bound | Sharded-LRTF | joint CP-SAT | CP-SAT | LRTF / bound | "
                  "joint / bound | joint <= LRTF |", "|---|---|---|---|---|---|---|---|---|---|"]
        for c in cases:
            lines.append(f"| {c['case']} | {c['models']} | {c['devices']} | {c['lb']:.4g} s | {c['lrtf']:.4g} s | "
                         f"{c['joint']:.4g} s | {c['status']} | {c['lrtf'] / c['lb']:.3f} | {c['joint'] / c['lb']:.3f} | "
                         f"{'yes' if c['joint'] <= c['lrtf'] + 1e-9 else 'NO'} |")
        lines += ["", "One model at a time on all 8 devices, the main case:", ""]
        for label, seconds in main["baselines"].items():
            lines.append(f"- {label}: {seconds:.4g} s, {seconds / main['joint']:.2f}x autopar's makespan")
        lines += ["", f"Targets: joint within 5% of the lower bound on the main case "
                  f"({main['joint'] / main['lb']:.3f}x: {'met' if main['joint'] <= 1.05 * main['lb'] else 'NOT met'}); "
                  f"joint <= LRTF on every case ({'met' if all(c['joint'] <= c['lrtf'] + 1e-9 for c in cases) else 'NOT met'}); "
                  f">= 3x faster than one-model-at-a-time model parallelism "
                  f"({next(iter(main['baselines'].values())) / main['joint']:.2f}x).", "",
                  f"![timeline]({PICTURE.name})", "", "```", plan.report(), "```", ""]
    text = "\n".join(lines)
    path.write_text(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", choices=["fusion", "scheduling"])
    parser.add_argument("--time-limit", type=float, default=20.0, help="CP-SAT's limit per case, seconds")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--device", default="cpu", help="where the fusion part runs (cuda: writes many_models_cuda.md)")
    args = parser.parse_args()
    import warnings

    warnings.filterwarnings("ignore", message="There is a performance drop")  # vmap's sdpa fallback, noted in the table
    fusion, plan, cases = [], None, []
    if args.only != "scheduling":
        for name in ("mlp", "cnn", "gpt"):
            for k in (4, 16):
                r = fusion_case(name, k, args.rounds, args.device)
                fusion.append(r)
                m = r["medians"]
                print(f"{name} K={k}: " + ", ".join(f"{lab} {_ms(v)}" for lab, v in m.items()) +
                      f"; autopar: {'fused' if r['choice'] == k else 'one by one'} ({'right' if r['right'] else 'WRONG'})",
                      flush=True)
    if args.only != "fusion":
        plan, cases = scheduling(args.time_limit)
        for c in cases:
            print(f"{c['case']}: bound {c['lb']:.4g} s, LRTF {c['lrtf']:.4g} s, joint {c['joint']:.4g} s", flush=True)
        plan.draw(str(PICTURE))
    out = RESULTS if args.device == "cpu" else RESULTS.with_name(f"many_models_{args.device.split(':')[0]}.md")
    text = write(fusion, plan, cases, args.rounds, Path("/dev/null") if args.no_write else out, args.device)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
