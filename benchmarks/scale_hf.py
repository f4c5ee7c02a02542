"""Planning Hugging Face decoders as users build them, at the scale they are trained: part 3 of
``make bench-scale`` (``benchmarks/scale.py`` runs it and writes its table into scale.md).

Each row: ``transformers.<Family>ForCausalLM(<Family>Config(...))`` built under
``torch.device("meta")``, then ``autopar.plan(model, dict(input_ids=ids, labels=ids), CLUSTER)``
with every default, in a fresh process. Reported: the wall and CPU seconds of trace + plan
(the CPU figure is what the process itself used, the honest one on a shared machine), the
process's peak resident memory, the plan (degrees, options), whether it fits, and the plan's
search line (which search ran, why, and what is proven about the plan). Targets: under 60 s
and 4 GB, fitting, mixed precision.
"""

from __future__ import annotations

import os
import time

from benchmarks.fresh_process import passed, result_rows, rss_bytes

TARGET_S, TARGET_BYTES = 60.0, 4 * 10**9
V3 = dict(vocab_size=128256, rope_theta=500000.0)
# name -> (family, config, cluster, sequence, batch)
ROWS = {
    "llama3_8b@64": ("llama", dict(num_hidden_layers=32, hidden_size=4096, intermediate_size=14336,
                                   num_attention_heads=32, num_key_value_heads=8, **V3), "8x8xH100", 8192, 64),
    "llama3_70b@64": ("llama", dict(num_hidden_layers=80, hidden_size=8192, intermediate_size=28672,
                                    num_attention_heads=64, num_key_value_heads=8, **V3), "8x8xH100", 4096, 64),
    "llama3_70b@256": ("llama", dict(num_hidden_layers=80, hidden_size=8192, intermediate_size=28672,
                                     num_attention_heads=64, num_key_value_heads=8, **V3), "32x8xH100", 8192, 1024),
    "llama3_70b@1024": ("llama", dict(num_hidden_layers=80, hidden_size=8192, intermediate_size=28672,
                                      num_attention_heads=64, num_key_value_heads=8, **V3), "128x8xH100", 8192,
                        1024),
    "llama3_405b@16384": ("llama", dict(num_hidden_layers=126, hidden_size=16384, intermediate_size=53248,
                                        num_attention_heads=128, num_key_value_heads=8, **V3), "2048x8xH100",
                          8192, 2048),
    "mistral_4l@1024": ("mistral", dict(num_hidden_layers=4, hidden_size=1024, intermediate_size=4096,
                                        num_attention_heads=16, num_key_value_heads=4, vocab_size=32000),
                        "128x8xH100", 2048, 1024),
    "qwen2_4l@1024": ("qwen2", dict(num_hidden_layers=4, hidden_size=1024, intermediate_size=4096,
                                    num_attention_heads=16, num_key_value_heads=4, vocab_size=151936),
                      "128x8xH100", 2048, 1024),
    "gpt2_4l@1024": ("gpt2", dict(n_layer=4, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024),
                     "128x8xH100", 1024, 1024),
}
CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
           "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "gpt2": ("GPT2Config", "GPT2LMHeadModel")}


def child(name: str) -> dict:
    """One row, in this (fresh) process."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    import autopar

    transformers.logging.set_verbosity_error()
    family, config, cluster, seq, batch = ROWS[name]
    cfg_cls, model_cls = (getattr(transformers, c) for c in CLASSES[family])
    if family != "gpt2":
        config = dict(config, max_position_embeddings=max(seq, 8192))
    wall, cpu = time.perf_counter(), time.process_time()
    with torch.device("meta"):
        model = model_cls(cfg_cls(**config))
        ids = torch.zeros(batch, seq, dtype=torch.long)
    plan = autopar.plan(model, dict(input_ids=ids, labels=ids), cluster)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    s = plan.strategy
    capacity = plan.cluster["memory_capacity"]
    return {"case": name, "cluster": cluster, "devices": plan.devices, "seq": seq, "batch": batch,
            "wall": wall, "cpu": cpu, "rss_peak": rss_bytes(),
            "degrees": s.degrees.describe() if s else "-", "options": s.options.describe() if s else "-",
            "precision": s.options.precision if s else "fp32", "step": plan.cost,
            "memory": plan.memory_per_device, "fits": plan.memory_per_device <= capacity,
            "mfu": s.mfu(plan.cost, plan.devices) if s else float("nan"),
            "search": f"{plan.search.name} in {plan.search.seconds:.3g} s, {plan.search.describe()}{_ending(plan)}",
            "load": os.getloadavg()[0]}


def _ending(plan) -> str:
    """How the hierarchical search ended: closed (its next bound reached the best plan; the
    candidates it priced and the tensor-group DPs it solved) or stopped at its time limit."""
    detail = plan.search.detail
    if plan.search.name != "hierarchical":
        return ""
    if detail.startswith("time limit reached"):
        return "; stopped at the time limit"
    return "; search closed: " + detail.rsplit("; ", 1)[-1]


def table(rows: list[dict]) -> str:
    lines = ["## Hugging Face decoders built on meta, `autopar.plan(model, dict(input_ids=ids, labels=ids), CLUSTER)`",
             "", "Each row in a fresh process: build on meta + trace + plan, every default. CPU seconds are the "
                 "process's own (on a shared machine wall time includes waiting for a core); load is the "
                 "1-minute load average when the row ended.", "",
             "| model | cluster | seq x batch | wall | CPU | peak RSS | plan | step | MFU | memory per device | fits | "
             "load | search line |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += result_rows(rows, 11, lambda r: (
        f"| {r['case'].split('@')[0]} | {r['cluster']} ({r['devices']}) | {r['seq']} x {r['batch']} | "
        f"{r['wall']:.1f} s | {r['cpu']:.1f} s | {r['rss_peak'] / 1e9:.2f} GB | {r['degrees']}; "
        f"{r['options']} | {r['step']:.3g} s | {r['mfu']:.1%} | {r['memory'] / 2**30:.1f} GiB | "
        f"{'yes' if r['fits'] else 'NO'} | {r['load']:.1f} | {r['search']} |"))
    lines += ["", "Targets: " + "; ".join([
        f"CPU under {TARGET_S:.0f} s: {passed(rows, lambda r: r['cpu'] < TARGET_S)}",
        f"wall under {TARGET_S:.0f} s: {passed(rows, lambda r: r['wall'] < TARGET_S)}",
        f"under 4 GB: {passed(rows, lambda r: r['rss_peak'] < TARGET_BYTES)}",
        f"fitting, mixed precision: {passed(rows, lambda r: r['fits'] and r['precision'] != 'fp32')}"]) + "."]
    return "\n".join(lines) + "\n"
