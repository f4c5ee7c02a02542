"""Planning a 24-layer Llama (Hugging Face, built on meta) on 64 GPUs: wall time and peak memory.

    .venv/bin/python -m benchmarks.plan_llama [--runs 3] [--layers 24]

The model: ``transformers.LlamaForCausalLM`` from its config, 24 layers, hidden 2048, 32 heads
with 8 key/value heads (grouped-query attention), MLP 5632, vocabulary 32000, sequence 2048,
global batch 64, built on ``device="meta"`` (no weights), called as people call it:
``model(input_ids=..., attention_mask=..., labels=...)``. Each run is a fresh Python process
(``--child``): import, build, ``autopar.trace`` (torch.export on meta), then ``autopar.plan`` on
the ``8x8xH100`` preset (64 GPUs in 8 nodes) with its defaults: analytic model, mesh space, exact
DP, baselines (data parallel, expert), pipeline search on (several nodes). Figures: medians over
the runs of wall and CPU time of trace and plan, and the process's peak resident set size
(``ru_maxrss``: interpreter, torch, transformers and the model included). Target:
trace + plan under 30 s and 2 GB. The figures and what dominates are in ``benchmarks/plan_llama.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from benchmarks import fresh_process
from benchmarks.fresh_process import rss_bytes

HERE = Path(__file__).resolve().parent
TARGET_S = 30.0
TARGET_BYTES = 2 * 10**9
CLUSTER = "8x8xH100"
SIZES = dict(hidden=2048, heads=32, kv_heads=8, mlp=5632, vocab=32000, seq=2048, batch=64)


def build(layers: int):
    """(model on meta, example kwargs on meta)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    s = SIZES
    config = transformers.LlamaConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["mlp"],
                                      num_hidden_layers=layers, num_attention_heads=s["heads"],
                                      num_key_value_heads=s["kv_heads"], max_position_embeddings=s["seq"])
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).train()
        ids = torch.zeros(s["batch"], s["seq"], dtype=torch.long)
        kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
    return model, kwargs


def child(layers: int) -> dict:
    import autopar

    model, kwargs = build(layers)
    before = rss_bytes()
    w, c = time.perf_counter(), time.process_time()
    graph = autopar.trace(model, kwargs)
    trace_wall, trace_cpu = time.perf_counter() - w, time.process_time() - c
    w, c = time.perf_counter(), time.process_time()
    plan = autopar.plan(model, kwargs, CLUSTER, graph=graph)
    plan_wall, plan_cpu = time.perf_counter() - w, time.process_time() - c
    dp = plan.baselines["data_parallel"].cost
    return {"layers": layers, "nodes": len(graph.nodes), "trace_wall": trace_wall, "trace_cpu": trace_cpu,
            "plan_wall": plan_wall, "plan_cpu": plan_cpu, "rss_before": before, "rss_peak": rss_bytes(),
            "cost": plan.cost, "dp_cost": dp, "stages": len(plan.stages or []), "search": plan.search.describe(),
            "dynamic_batch": graph.call.dynamic_batch, "replicated": len(plan.unsupported)}


def run_child(layers: int, timeout: float = 900.0) -> dict:
    return fresh_process.run_child("benchmarks.plan_llama", ["--layers", str(layers)], timeout=timeout)


def summary(runs: list[dict]) -> dict:
    med = {k: statistics.median(r[k] for r in runs) for k in
           ("trace_wall", "trace_cpu", "plan_wall", "plan_cpu", "rss_peak", "rss_before")}
    med["total_wall"] = statistics.median(r["trace_wall"] + r["plan_wall"] for r in runs)
    med["total_cpu"] = statistics.median(r["trace_cpu"] + r["plan_cpu"] for r in runs)
    return med


def table(runs: list[dict], med: dict) -> str:
    gb = lambda b: f"{b / 1e9:.2f} GB"  # noqa: E731
    lines = ["| run | trace wall / CPU | plan wall / CPU | trace + plan wall / CPU | peak RSS |", "|---|---|---|---|---|"]
    for i, r in enumerate(runs, 1):
        lines.append(f"| {i} | {r['trace_wall']:.1f} / {r['trace_cpu']:.1f} s | {r['plan_wall']:.1f} / "
                     f"{r['plan_cpu']:.1f} s | {r['trace_wall'] + r['plan_wall']:.1f} / "
                     f"{r['trace_cpu'] + r['plan_cpu']:.1f} s | {gb(r['rss_peak'])} |")
    lines.append(f"| median | {med['trace_wall']:.1f} / {med['trace_cpu']:.1f} s | {med['plan_wall']:.1f} / "
                 f"{med['plan_cpu']:.1f} s | {med['total_wall']:.1f} / {med['total_cpu']:.1f} s | "
                 f"{gb(med['rss_peak'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.layers)))
        return 0
    runs = []
    for i in range(args.runs):
        r = run_child(args.layers)
        if "error" in r:
            print(f"run {i + 1}: error: {r['error']}")
            return 1
        print(f"run {i + 1}: trace {r['trace_wall']:.1f} s, plan {r['plan_wall']:.1f} s (CPU {r['plan_cpu']:.1f} s), "
              f"peak RSS {r['rss_peak'] / 1e9:.2f} GB, {r['nodes']} nodes, {r['stages']} stages", flush=True)
        runs.append(r)
    med = summary(runs)
    print(table(runs, med))
    print(f"under {TARGET_S:.0f} s: {'yes' if med['total_wall'] < TARGET_S else 'NO'} (wall), "
          f"{'yes' if med['total_cpu'] < TARGET_S else 'NO'} (CPU); under 2 GB: "
          f"{'yes' if med['rss_peak'] < TARGET_BYTES else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
