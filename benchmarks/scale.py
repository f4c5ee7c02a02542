"""Planning the largest published trainings, and how planning time grows with the device count.

    .venv/bin/python -m benchmarks.scale [--repeat 3] [--only NAME ...] [--no-write]

Part 1, the four published trainings (``autopar.zoo.published``) on their papers' clusters, as
``autopar plan zoo:NAME --published`` does: trace (meta tensors), hierarchical search, the
data-parallel baseline and the paper's plan pinned and priced. Reported: the whole time (trace +
plan, median of ``repeat`` runs in one fresh process) and the process's peak resident memory;
autopar's degrees and options beside the paper's; the predicted utilisation of the paper's plan
beside the reported one (hardware FLOPs where the paper counts the recomputation, MFU for PaLM);
autopar's predicted MFU and its speed-up over the paper's plan under the same cost model.
Targets: each under 60 s and 4 GB; autopar no slower than the paper's plan and
fitting; the paper's plan predicted within 15% of its reported utilisation.

Part 2, the sweep: a GPT-3-wide GPT (width 12288, 96 heads, sequence 2048, 8 layers, vocabulary
51200, batch 512) on DGX A100 nodes of 8 (``dgxa100``), 8 ... 4096 devices, with the
hierarchical search forced at every count, and up to 64 devices the automatic plan beside it
(every default: the flat exact DP where its tables times its training option sets are within
its budget, ``planning/budget.py``, else the hierarchical search). Reported per count: planning time (median of ``repeat``, tracing excluded: it
does not depend on the device count), peak memory, degrees and MFU. Target: time growing at most
linearly with log(devices) from 64 to 4096.

Part 3, torchtitan-style recipes (the hand plans users run for Llama 3: FSDP2 ``fully_shard``,
i.e. ZeRO-3, with full activation checkpointing; + tensor parallelism 8 for 70B; + pipeline
parallelism for 405B) pinned with ``--pin`` on the zoo's Llama 3 shapes (``zoo:llama3``), priced
beside autopar's plan under the same cost model. Target: autopar's plan no slower and fitting.

Part 4 (``benchmarks/scale_hf.py``): Hugging Face decoders built on meta (Llama 3 8B, 70B,
405B shapes; small Mistral, Qwen2, GPT-2) planned with ``autopar.plan``'s defaults on 64 to
16,384 H100s.

Each case runs in a fresh process (``--child``). Results: ``benchmarks/scale.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from benchmarks.fresh_process import passed, result_rows, rss_bytes, run_child, timed

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "scale.md"
PUBLISHED = ("megatron_8b", "megatron_1t", "mt_nlg_530b", "palm_540b", "llama3_405b", "llama3_405b_long")
SWEEP = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
AUTO_UP_TO = 64  # above, the automatic plan is the hierarchical search (planning/hierarchical.py)
ISSUE_GPT = dict(width=12288, heads=96, seq=2048, layers=8, vocab=51200, batch=512, attention="manual",
                 device="meta")
TARGET_S, TARGET_BYTES = 60.0, 4 * 10**9
# name -> (zoo:llama3 sizes, cluster, torchtitan-style pin): FSDP (ZeRO-3) + full activation checkpointing
RECIPES = {
    "llama3-8b-fsdp-8": (dict(size="8b", seq=8192, batch=8), "1x8xh100", "tensor=1,pipeline=1,zero=3,recompute=1"),
    "llama3-8b-fsdp-64": (dict(size="8b", seq=8192, batch=64), "8x8xh100", "tensor=1,pipeline=1,zero=3,recompute=1"),
    "llama3-70b-fsdp-tp8-256": (dict(size="70b", seq=8192, batch=1024), "32x8xh100",
                                "tensor=8,pipeline=1,zero=3,recompute=1"),
    "llama3-70b-fsdp-tp8-1024": (dict(size="70b", seq=8192, batch=1024), "128x8xh100",
                                 "tensor=8,pipeline=1,zero=3,recompute=1"),
    "llama3-405b-fsdp-tp8-pp16-16384": (dict(size="405b", seq=8192, batch=2048), "2048x8xh100",
                                        "tensor=8,pipeline=16,zero=3,recompute=1,microbatch=1"),
}


# Why the rows outside 15% are outside, from the papers (the model's terms are in `autopar plan zoo:NAME
# --published`'s report).
NOT_WITHIN = [
    "Where a prediction is outside 15%: mt_nlg_530b ran the shape that Megatron-LM itself ran at 52% of peak "
    "(Narayanan et al. 2021, Table 1: tensor 8 x pipeline 35 x data 9 on 2520 A100, batch 2520, interleaved 3 "
    "stages per rank), which this model prices at 1.08x; the ten rows of that table, 1.7B to 1T, price at "
    "1.05-1.13x (tests/planning/test_published.py). MT-NLG's plain 1F1B over 160 microbatches explains 52% -> "
    "44.6% at Megatron-LM's speed per microbatch; its 36.2% is 1.23x slower per microbatch on the "
    "same machines, shape and layers per rank, with DeepSpeed's pipeline engine: what that engine and "
    "Megatron-DeepSpeed's public code of the time do beyond the price adds about 2% of the step, 11% if "
    "it accumulated gradients in fp32 as the 2022 bf16 optimizer does (autopar/zoo/published.py): the "
    "rest is unexplained. The paper's three scales (60.1, 50.2, 44.4 s on 280, 350, 420 nodes) fit "
    "(m + 34) slots of a constant 386-390 ms at 2 sequences a microbatch, where at 1 they need 51-66 "
    "bubble slots or 6 s a step; priced at 2 they read 1.21-1.22x, no longer trending with the data "
    "degree. The preset keeps the 1 it has always priced: no source at hand states the run's size.",
]


def _summary(plan) -> dict:
    s = plan.strategy
    d = s.degrees
    return {"degrees": d.describe(), "t": d.t, "p": d.p, "d": d.d, "options": s.options.describe(),
            "microbatch": f"{s.microbatch_size} x {plan.microbatches}", "cost": plan.cost,
            "memory": plan.memory_per_device, "mfu": s.mfu(plan.cost, plan.devices),
            "hfu": s.hfu(plan.cost, plan.devices), "status": plan.search.describe()}


def child_published(name: str, repeat: int) -> dict:
    import autopar
    from autopar.cli import build_parser, _plan

    walls, plan = timed(repeat, lambda: _plan(build_parser().parse_args(["plan", f"zoo:{name}", "--published"])))
    rec = autopar.zoo.published_run(name)
    pub = plan.baselines["published"]
    hw = rec.measure == "hardware"
    pred = pub.strategy.hfu(pub.cost, pub.devices) if hw else pub.strategy.mfu(pub.cost, pub.devices)
    return {"case": name, "cluster": rec.cluster, "walls": walls, "wall": statistics.median(walls),
            "rss_peak": rss_bytes(), "autopar": _summary(plan), "published": _summary(pub),
            "published_figure": rec.utilisation, "measure": rec.measure, "predicted": pred,
            "fits": plan.memory_per_device <= plan.cluster["memory_capacity"],
            "published_fits": pub.memory_per_device <= plan.cluster["memory_capacity"],
            "search_seconds": plan.search.seconds}


def child_sweep(devices: int, repeat: int) -> dict:
    import autopar
    from autopar.core.cluster import Cluster
    from autopar.planning.hierarchical import use_hierarchical

    model, inputs = autopar.zoo.get("gpt", **ISSUE_GPT)
    graph = autopar.trace(model, inputs)
    cluster = Cluster.preset("dgxa100", devices=devices)
    before = rss_bytes()
    walls, plan = timed(repeat, lambda: autopar.plan(model, inputs, cluster, graph=graph, hierarchical=True,
                                                     model_name="gpt-scale"))
    rss_hier = rss_bytes()  # the hierarchical search's peak, before the automatic plan beside it
    auto, ap, auto_error = [], None, ""
    if devices <= AUTO_UP_TO:  # what a user gets with every default: the flat exact DP within its budget
        from autopar.core.errors import InfeasibleError

        for _ in range(repeat):
            start = time.perf_counter()
            try:
                ap = autopar.plan(model, inputs, cluster, graph=graph, model_name="gpt-scale")
            except InfeasibleError as e:
                auto_error = "does not fit: " + str(e).split(" on ")[0].split(": ", 1)[-1]
                break
            auto.append(time.perf_counter() - start)
    return {"case": f"sweep-{devices}", "devices": devices, "walls": walls, "wall": statistics.median(walls),
            "auto_wall": statistics.median(auto) if auto else None,
            "auto_cost": ap.cost if auto else None, "auto_error": auto_error,
            "auto_rss": rss_bytes() if auto else None,
            "rss_before": before, "rss_peak": rss_hier,
            "auto_path": ("hierarchical" if ap.search.name == "hierarchical" else "flat exact DP") if auto
            else "hierarchical" if use_hierarchical(cluster) else "-", **_summary(plan)}


def child_recipe(name: str, repeat: int) -> dict:
    import autopar
    from autopar.core.cluster import Cluster

    sizes, cluster_name, pin = RECIPES[name]
    model, inputs = autopar.zoo.get("llama3", **sizes)
    cluster = Cluster.preset(cluster_name)
    walls, plan = timed(repeat, lambda: autopar.plan(model, inputs, cluster, graph=autopar.trace(model, inputs),
                                                     hierarchical=True, pin=pin, precision="bf16", model_name=name))
    pinned = plan.baselines["published"]
    capacity = plan.cluster["memory_capacity"]
    return {"case": name, "cluster": cluster_name, "pin": pin, "wall": statistics.median(walls),
            "rss_peak": rss_bytes(), "autopar": _summary(plan), "recipe": _summary(pinned),
            "fits": plan.memory_per_device <= capacity, "recipe_fits": pinned.memory_per_device <= capacity}


def plan_cells(s: dict, cost: str = ".3g") -> str:
    """A plan's table cells: degrees; options; microbatch | step | MFU."""
    return f"{s['degrees']}; {s['options']}; {s['microbatch']} | {s['cost']:{cost}} s | {s['mfu']:.1%}"


def write_recipes(rows: list[dict]) -> list[str]:
    lines = ["## torchtitan-style recipes pinned (`--pin`) beside autopar's plan, zoo:llama3 shapes, bf16", "",
             "| case | cluster | recipe pin | recipe: degrees, options, microbatch | step | MFU | fits | "
             "autopar: degrees, options, microbatch | step | MFU | fits | speed-up | time (trace + plan) | peak RSS |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def line(r: dict) -> str:
        a, p = r["autopar"], r["recipe"]
        return (f"| {r['case']} | {r['cluster']} | `{r['pin']}` | {plan_cells(p)} | "
                f"{'yes' if r['recipe_fits'] else 'NO'} | {plan_cells(a)} | {'yes' if r['fits'] else 'NO'} | "
                f"{p['cost'] / a['cost']:.3f}x | {r['wall']:.1f} s | {r['rss_peak'] / 1e9:.2f} GB |")

    lines += result_rows(rows, 12, line)
    lines += ["", "autopar no slower than the recipe and fitting: "
                  f"{passed(rows, lambda r: r['recipe']['cost'] >= r['autopar']['cost'] and r['fits'])}.", ""]
    return lines


def run(args_list: list[str], timeout: float = 1200.0) -> dict:
    return run_child("benchmarks.scale", args_list, " ".join(args_list), timeout)


def gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB"


def write(published: list[dict], sweep: list[dict], repeat: int) -> str:
    lines = ["# Planning the largest published trainings", "",
             f"`make bench-scale` (benchmarks/scale.py), {time.strftime('%Y-%m-%d')}, the benchmark machine "
             f"(benchmarks/README.md), OMP_NUM_THREADS=1; times are medians of {repeat} runs in one fresh process per case.", "",
             "## The published trainings, `autopar plan zoo:NAME --published`", "",
             "| model | cluster | time (trace + plan) | peak RSS | autopar: degrees, options, microbatch | step | MFU | "
             "paper: degrees, options | paper's plan priced | reported | predicted for it | ratio | autopar speed-up | fits |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def line(r: dict) -> str:
        a, p = r["autopar"], r["published"]
        what = "HFU" if r["measure"] == "hardware" else "MFU"
        return (f"| {r['case']} | {r['cluster']} | {r['wall']:.1f} s | {r['rss_peak'] / 1e9:.2f} GB | "
                f"{plan_cells(a, '.2f')} | {p['degrees']}; {p['options']} | {p['cost']:.2f} s | {r['published_figure']:.1%} {what} | {r['predicted']:.1%} | "
                f"{r['predicted'] / r['published_figure']:.2f}x | {p['cost'] / a['cost']:.3f}x | "
                f"{'yes' if r['fits'] else 'NO'} (paper's: {'yes' if r['published_fits'] else 'NO'}) |")

    lines += result_rows(published, 12, line)
    ok = [r for r in published if "error" not in r]
    lines += ["", "Targets: " + "; ".join([
        f"under {TARGET_S:.0f} s: {passed(published, lambda r: r['wall'] < TARGET_S)}",
        f"under 4 GB: {passed(published, lambda r: r['rss_peak'] < TARGET_BYTES)}",
        "autopar no slower than the paper's plan and fitting: "
        f"{passed(published, lambda r: r['published']['cost'] >= r['autopar']['cost'] and r['fits'])}",
        "paper's plan within 15% of its reported utilisation: "
        f"{passed(published, lambda r: 0.85 <= r['predicted'] / r['published_figure'] <= 1.15)}"]) + ".",
        "", "Search status of autopar's plans: " + "; ".join(f"{r['case']}: {r['autopar']['status']}" for r in ok), "",
        *NOT_WITHIN, ""]
    lines += ["## Sweep: a GPT-3-wide GPT (width 12288, 8 layers, batch 512) on DGX A100 nodes, hierarchical search", "",
              "| devices | automatic path | planning time | peak RSS | degrees | options | microbatch | step | MFU | "
              "automatic plan (every default): time, peak RSS, step |",
              "|---|---|---|---|---|---|---|---|---|---|"]

    def swept(r: dict) -> str:
        flat = (f"{r['auto_wall']:.2f} s, {r['auto_rss'] / 1e9:.2f} GB, {r['auto_cost']:.3g} s"
                if r.get("auto_wall") is not None else r["auto_error"] if r.get("auto_error") else
                "the hierarchical search (this row)")
        return (f"| {r['devices']} | {r['auto_path']} | {r['wall']:.2f} s | {r['rss_peak'] / 1e9:.2f} GB | "
                f"{r['degrees']} | {r['options']} | {r['microbatch']} | {r['cost']:.3g} s | {r['mfu']:.1%} | "
                f"{flat} |")

    lines += result_rows(sweep, 7, swept)
    by = {r["devices"]: r for r in sweep if "error" not in r}
    if 64 in by and 4096 in by:
        grow = by[4096]["wall"] / by[64]["wall"]
        lines += ["", f"Growth from 64 to 4096 devices: {grow:.2f}x the time for {math.log2(4096) / math.log2(64):.0f}x "
                      f"log(devices) (linear in log(devices) allows 2x): "
                      f"{'within' if grow <= 2 else 'NOT within'} the target."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None, help="published model names and/or device counts")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--child", nargs="+", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        kind, what = a.child[0], a.child[1]
        if kind == "hf":
            from benchmarks import scale_hf

            print(json.dumps(scale_hf.child(what)))
            return 0
        out = (child_published(what, a.repeat) if kind == "published" else child_recipe(what, a.repeat)
               if kind == "recipe" else child_sweep(int(what), a.repeat))
        print(json.dumps(out))
        return 0
    only = set(a.only or [])
    published = [run(["published", n, "--repeat", str(a.repeat)]) for n in PUBLISHED if not only or n in only]
    for r in published:
        print(json.dumps(r)[:400], flush=True)
    sweep = [run(["sweep", str(p), "--repeat", str(a.repeat)]) for p in SWEEP if not only or str(p) in only]
    for r in sweep:
        print(json.dumps(r)[:300], flush=True)
    recipes = [run(["recipe", n, "--repeat", str(a.repeat)]) for n in RECIPES if not only or n in only]
    for r in recipes:
        print(json.dumps(r)[:300], flush=True)
    from benchmarks import scale_hf  # part 4: Hugging Face decoders, one fresh process per row

    hf = [run(["hf", n]) for n in scale_hf.ROWS if not only or n in only]
    for r in hf:
        print(json.dumps(r)[:400], flush=True)
    text = (write(published, sweep, a.repeat) + "\n" + "\n".join(write_recipes(recipes))
            + ("\n" + scale_hf.table(hf) if hf else ""))
    print(text)
    if not a.no_write:
        RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
