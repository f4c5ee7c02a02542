"""Planning mixtures of experts at scale: DeepSeek-V3's shape on 2,048 H100 and Mixtral 8x7B's
on 64 and 256, through the hierarchical search with its expert degree.

    .venv/bin/python -m benchmarks.scale_moe [--repeat 1] [--only NAME ...] [--no-write]

Run by ``make bench-scale`` after ``benchmarks/scale.py``. Each case in a fresh process: the zoo's
preset built on meta, traced and planned (``autopar.plan(..., hierarchical=True)``, search time
limit ``LIMIT_S``) with a pinned plan priced beside it (``CASES``: DeepSeek-V3's own layout; for
Mixtral, whose layout is not published, ``expert=1``: the best plan whose experts are not split).
Reported: the whole time (trace + plan with the pinned one, median of ``repeat``) and the
process's CPU time (the box is shared: CPU seconds do not grow with other work), peak resident
memory, the plan's degrees (expert degree included) and options, its predicted step and MFU
(model FLOPs: the routed tokens' expert FLOPs, not every expert on every token), and the pinned
plan's step. Targets: under 60 s and 4 GB, a fitting plan.
Results: ``benchmarks/scale_moe.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

from benchmarks.fresh_process import passed, result_rows, run_child, timed
from benchmarks.scale import TARGET_BYTES, TARGET_S, _summary

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "scale_moe.md"
# (case, zoo preset, sizes, cluster): DeepSeek-V3 ran sequences of 4096 in batches of up to 15360
# (its technical report, 4.2); Mixtral's batch is not published: 1024 sequences of 4096 (4M tokens)
# Beside autopar's plan, a pinned one: DeepSeek-V3's own layout (pipeline 16 x expert 64 over data
# 128, ZeRO-1, no tensor parallelism: its technical report, 3.2), Mixtral's experts replicated
CASES = (("deepseek_v3-2048", "deepseek_v3", dict(batch=15360, seq=4096), "256x8xH100",
          "tensor=1,pipeline=16,data=128,expert=64,zero=1"),
         ("mixtral_8x7b-64", "mixtral_8x7b", dict(batch=1024, seq=4096), "8x8xH100", "expert=1"),
         ("mixtral_8x7b-256", "mixtral_8x7b", dict(batch=1024, seq=4096), "32x8xH100", "expert=1"))
# the search's wall-clock limit: above the target, so that a box busy with other work still closes
# the bound (the search stops at its limit with the best plan so far, a different plan); the
# target is checked on the process's CPU time as well as on the wall clock
LIMIT_S = 900.0


def child(case: str, repeat: int) -> dict:
    import autopar

    _, name, sizes, cluster, pin = next(c for c in CASES if c[0] == case)
    def trace_and_plan():
        model, inputs = autopar.zoo.get(name, device="meta", **sizes)
        return autopar.plan(model, inputs, cluster, hierarchical=True, pin=pin, model_name=name, time_limit=LIMIT_S)

    walls, plan = timed(repeat, trace_and_plan)
    use = resource.getrusage(resource.RUSAGE_SELF)
    rep = plan.baselines.get("published")
    capacity = plan.cluster["memory_capacity"]
    return {"case": case, "model": name, "sizes": sizes, "cluster": cluster, "walls": walls,
            "wall": statistics.median(walls), "cpu": (use.ru_utime + use.ru_stime) / repeat,
            "rss_peak": use.ru_maxrss * 1024, "load": os.getloadavg()[0], "ep": plan.strategy.degrees.ep, "autopar": _summary(plan),
            "fits": plan.memory_per_device <= capacity, "terms": plan.strategy.time_terms,
            "pin": pin, "replicated": _summary(rep) if rep else None,
            "replicated_terms": rep.strategy.time_terms if rep else {},
            "replicated_fits": rep is not None and rep.memory_per_device <= capacity}


def run(case: str, repeat: int, timeout: float = 1800.0) -> dict:
    return run_child("benchmarks.scale_moe", [case, "--repeat", str(repeat)], case, timeout)


def write(rows: list[dict], repeat: int) -> str:
    lines = ["# Planning mixtures of experts at scale", "",
             f"`make bench-scale` (benchmarks/scale_moe.py), {time.strftime('%Y-%m-%d')}, the benchmark machine "
             f"(benchmarks/README.md), shared with other work while it ran: wall times are medians of {repeat} "
             "run(s) in one fresh process per case; CPU time is the process's own.", "",
             "Models: the zoo's `deepseek_v3` (61 layers, the first 3 dense, width 7168, 256 routed experts top-8 of "
             "ffn 2048 + 1 shared, MLA, vocabulary 129280) and `mixtral_8x7b` (32 layers, width 4096, 8 experts top-2 "
             "of ffn 14336, 32/8 heads, vocabulary 32000), sequences of 4096, built on meta. Expert FLOPs are the "
             "routed tokens' (uniform routing, no load imbalance: an assumption the plans state).", "",
             "| case | cluster | batch | time (trace + plan) | CPU time | peak RSS | degrees | options | microbatch | "
             "step | MFU | fits | pinned beside it: pin; degrees; step (MFU) | expert all-to-all in the step: autopar's, pinned |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def line(r: dict) -> str:
        a, rep = r["autopar"], r["replicated"]
        base = (f"`{r.get('pin', 'expert=1')}`; {rep['degrees']}; {rep['cost']:.3g} s ({rep['mfu']:.1%})"
                f"{'' if r['replicated_fits'] else ' (does not fit)'}" if rep else "-")
        return (f"| {r['model']} | {r['cluster']} | {r['sizes']['batch']} x {r['sizes']['seq']} | {r['wall']:.1f} s | "
                f"{r['cpu']:.1f} s | {r['rss_peak'] / 1e9:.2f} GB | {a['degrees']} | {a['options']} | "
                f"{a['microbatch']} | {a['cost']:.3g} s | {a['mfu']:.1%} | {'yes' if r['fits'] else 'NO'} | {base} | "
                f"{r['terms'].get('expert all-to-all', 0.0):.3g} s, "
                f"{r.get('replicated_terms', {}).get('expert all-to-all', 0.0):.3g} s |")

    lines += result_rows(rows, 12, line)
    ok = [r for r in rows if "error" not in r]
    loads = [r["load"] for r in ok if "load" in r]
    if loads:
        lines += ["", f"Load average (1 min) at the end of each case: {', '.join(f'{x:.1f}' for x in loads)} on the "
                      "benchmark machine (benchmarks/README.md): the wall times are those of a process given a fraction of a core; its CPU time is what it needs alone."]
    lines += ["", "Targets: " + "; ".join([
        f"under {TARGET_S:.0f} s wall: {passed(rows, lambda r: r['wall'] < TARGET_S)}",
        f"under {TARGET_S:.0f} s CPU: {passed(rows, lambda r: r['cpu'] < TARGET_S)}",
        f"under 4 GB: {passed(rows, lambda r: r['rss_peak'] < TARGET_BYTES)}",
        f"fitting: {passed(rows, lambda r: r['fits'])}"]) + ".", "",
        "Search status: " + "; ".join(f"{r['case']}: {r['autopar']['status']}" for r in ok), ""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=None, help="case names (deepseek_v3-2048, mixtral_8x7b-64, ...)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.repeat)))
        return 0
    rows = []
    for case, *_ in CASES:
        if a.only and case not in a.only:
            continue
        rows.append(run(case, a.repeat))
        print(json.dumps(rows[-1])[:400], flush=True)
    text = write(rows, a.repeat)
    print(text)
    if not a.no_write:
        RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
