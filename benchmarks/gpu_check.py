"""The checks that need a GPU, in one run on a machine with one H100 or H200:

    python -m benchmarks.gpu_check [--out benchmarks/gpu_check.md]

1. ``autopar measure`` for a Llama 3 8B plan on 64 GPUs (``8x8xH100``): rank 0 and the first rank
   of the fullest pipeline stage, the rank's shards built on the GPU from the model's weights in
   host memory (32 GB fp32) over torch's fake process group; measured/predicted memory
   (``torch.cuda.max_memory_allocated``) and compute.
2. Llama 3 70B on 1,024 GPUs (``8x8xH100`` with 1,024 devices: 128 nodes of 8): the plan, and the rank's predicted memory against
   this GPU's; ``measure`` needs the model's weights in host memory (282 GB in fp32), so it runs
   only where the host has them, else the rank's shard (the plan's memory terms) is stated.
3. The profiled cost model's op timings taken on the GPU: every node of the 8B plan at rank 0's
   local shapes, forward and backward (``ProfiledModel(device="cuda")``), their sum beside the
   analytic model's compute and the measured step of 1.
4. ``make bench-many``'s fused-vs-one-by-one comparison on the GPU
   (``benchmarks.many_models --only fusion --device cuda``: writes ``many_models_cuda.md``).

Each step runs the public commands in a fresh process with a time limit, so one that fails leaves
the others' figures; everything is written to ``--out`` (markdown) as it comes.

Without a CUDA device it prints one line and exits 2 (nothing was measured: not a success, 0,
and not a failure, 1), before importing anything heavy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NO_GPU = 2
ROOT = Path(__file__).resolve().parent.parent
FACTORY = "benchmarks/llama3.py"
CASES = [("8b", 64, "8x8xH100"), ("70b", 1024, "8x8xH100")]  # the preset's H100 nodes, --devices of them


def cuda_available() -> bool:
    """A CUDA device torch can use; without an NVIDIA driver's device files, no (and fast: torch
    is not imported)."""
    import glob
    import shutil

    if shutil.which("nvidia-smi") is None and not glob.glob("/dev/nvidia[0-9]*"):
        return False
    import torch

    return torch.cuda.is_available()


def _run(cmd: list[str], timeout: float) -> tuple[int, str, float]:
    t0 = time.time()
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        out, rc = (r.stdout + r.stderr).strip(), r.returncode
    except subprocess.TimeoutExpired:
        out, rc = f"timed out after {timeout:.0f} s", 124
    return rc, out, time.time() - t0


def _autopar(*args: str) -> list[str]:
    return [sys.executable, "-m", "autopar", *args]


class Report:
    """The markdown written to ``path`` after every step (a later failure keeps earlier figures)."""

    def __init__(self, path: Path, header: list[str]):
        self.path, self.lines = path, list(header)
        self.flush()

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)
        print("\n".join(lines), flush=True)
        self.flush()

    def flush(self) -> None:
        self.path.write_text("\n".join(self.lines) + "\n")


def plan_case(size: str, devices: int, cluster: str, tmp: Path, report: Report) -> dict | None:
    out = tmp / f"llama3_{size}_{devices}.json"
    rc, text, secs = _run(_autopar("plan", f"{FACTORY}:llama3_{size}_meta", "--cluster", cluster, "--devices",
                                   str(devices), "--json", str(out)), 1800)
    if rc != 0:
        report.add(f"* Llama 3 {size} on {devices}: `autopar plan` failed ({secs:.0f} s): {text.splitlines()[-1:]}")
        return None
    doc = json.loads(out.read_text())
    doc["_path"] = str(out)
    stages = doc.get("stages") or []
    report.add(f"* Llama 3 {size} on {devices} ({cluster}): planned in {secs:.0f} s; {len(stages) or 1} stage(s); "
               f"predicted memory per device {doc['memory_per_device'] / 2**30:.2f} GiB")
    return doc


def measure_case(size: str, plan: dict, rank: str, tmp: Path, report: Report, gpu_bytes: float) -> dict | None:
    from benchmarks.llama3 import parameters

    host = _host_available()
    whole = 4.0 * parameters(size)  # fp32 weights the measured model is built from
    if plan["memory_per_device"] > gpu_bytes:
        report.add(f"  * rank {rank}: the plan's {plan['memory_per_device'] / 2**30:.1f} GiB per device exceed this "
                   f"GPU's {gpu_bytes / 2**30:.1f} GiB: not measured")
        return None
    if host is not None and whole > 0.9 * host:
        terms = (plan.get("strategy") or {}).get("memory_terms") or {}
        shown = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in terms.items())
        report.add(f"  * rank {rank}: not measured: `measure` builds the rank from the model's weights in host memory "
                   f"({whole / 2**30:.0f} GiB fp32, {host / 2**30:.0f} GiB available); the rank's shard as planned: "
                   f"{shown or 'see the plan'}")
        return None
    out = tmp / f"measure_{size}_{rank}.json"
    rc, text, secs = _run(_autopar("measure", f"{FACTORY}:llama3_{size}", "--plan", plan["_path"], "--rank", rank,
                                   "--steps", "3", "--json", str(out)), 2400)
    if rc != 0:
        report.add(f"  * rank {rank}: `autopar measure` failed ({secs:.0f} s): {text.splitlines()[-1:]}")
        return None
    m = json.loads(out.read_text())
    report.add(f"  * rank {m['rank']} ({secs:.0f} s): {text.splitlines()[-1]} (peak {m['measured_memory'] / 2**30:.2f} "
               f"GiB, predicted {m['predicted_memory'] / 2**30:.2f} GiB; step {m['measured_compute'] * 1e3:.1f} ms, "
               f"predicted {m['predicted_compute'] * 1e3:.1f} ms)")
    return m


def _host_available() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def op_timings(plan: dict, report: Report) -> None:
    """Step 3 in a child process (the traced 8B graph and the timed ops stay out of this one)."""
    rc, text, secs = _run([sys.executable, "-m", "benchmarks.gpu_op_timings", FACTORY + ":llama3_8b_meta",
                           plan["_path"]], 1800)
    report.add(f"* profiled op timings on the GPU, Llama 3 8B plan, rank 0's local shapes ({secs:.0f} s):",
               *(f"  {line}" for line in text.splitlines()[-8:]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).with_name("gpu_check.md")))
    args = p.parse_args(argv)
    if not cuda_available():
        print("gpu_check: no CUDA device here: nothing measured (run it on a machine with one H100 or H200)")
        return NO_GPU
    import torch

    props = torch.cuda.get_device_properties(0)
    report = Report(Path(args.out), ["# The checks that need a GPU (benchmarks/gpu_check.py)", "",
                                     f"Device: {props.name}, {props.total_memory / 2**30:.1f} GiB; torch "
                                     f"{torch.__version__}; `python -m benchmarks.gpu_check`.", ""])
    with tempfile.TemporaryDirectory() as tmp:
        plans = {}
        for size, devices, cluster in CASES:
            plan = plan_case(size, devices, cluster, Path(tmp), report)
            plans[size] = plan
            if plan is not None:
                for rank in ("0", "fullest"):
                    measure_case(size, plan, rank, Path(tmp), report, props.total_memory)
        if plans.get("8b") is not None:
            op_timings(plans["8b"], report)
    rc, text, secs = _run([sys.executable, "-m", "benchmarks.many_models", "--only", "fusion", "--device", "cuda"], 1800)
    report.add(f"* fused vs one-by-one on the GPU (`benchmarks.many_models --only fusion --device cuda`, {secs:.0f} s, "
               f"exit {rc}; the table is in benchmarks/many_models_cuda.md):", *(f"  {x}" for x in text.splitlines()[-6:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
