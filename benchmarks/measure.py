"""One rank of the zoo gpt's plans for 8, 64 and 512 devices, measured on this CPU beside the plan.

    .venv/bin/python -m benchmarks.measure [--out benchmarks/measure.md] [--steps 4]

Each case runs ``autopar measure`` in a fresh process (one rank over torch's fake process group,
one thread: a device of the ``cpu`` preset), rank 0, with the analytic and the profiled cost
model, and a pipelined (hierarchical) plan for 512 devices, which ``measure`` refuses for now;
the table of measured/predicted peak memory and compute per step is written as markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SIZES = "layers=2,width=256,heads=8,seq=128,batch=64,vocab=4096"
MODEL = f"zoo:gpt:{SIZES}"
START, END = "<!-- table: benchmarks/measure.py -->", "<!-- end of table -->"
CASES = [(n, cost, "off") for cost in ("analytic", "profiled") for n in (8, 64, 512)] + [(512, "analytic", "auto")]


def run_case(devices: int, cost: str, hierarchical: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "m.json"
        cmd = [sys.executable, "-m", "autopar", "measure", MODEL, "--devices", str(devices), "--rank", "0",
               "--cost-model", cost, "--hierarchical", hierarchical, "--steps", str(steps), "--json", str(out)]
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                           timeout=1800)
        shown = " ".join(c for c in cmd[1:] if c != str(out)).replace(" --json", "")
        if r.returncode != 0:
            return dict(devices=devices, cost=cost, hierarchical=hierarchical, command=shown,
                        error=r.stderr.strip().splitlines()[-1])
        return dict(json.loads(out.read_text()), cost=cost, hierarchical=hierarchical, command=shown)


HEADER = ("| devices | cost model | plan | memory measured (MiB) | predicted (MiB) | ratio | "
          "compute measured (ms) | predicted (ms) | ratio |\n|---|---|---|---|---|---|---|---|---|")


def mib(x: float) -> str:
    return f"{x / 2**20:.1f}"


def table(rows: list[dict]) -> str:
    lines = [HEADER]
    for r in rows:
        plan = "hierarchical (auto)" if r["hierarchical"] == "auto" else "flat mesh, one stage"
        if "error" in r:
            why = r["error"].removeprefix("autopar: error: ").split(": measure", 1)[0]
            lines.append(f"| {r['devices']} | {r['cost']} | {plan} | refused: {why} |||||||")
            continue
        lines.append(f"| {r['devices']} | {r['cost']} | {plan} | {mib(r['measured_memory'])} | "
                     f"{mib(r['predicted_memory'])} | {r['measured_memory'] / r['predicted_memory']:.2f} | "
                     f"{r['measured_compute'] * 1e3:.1f} | {r['predicted_compute'] * 1e3:.1f} | "
                     f"{r['measured_compute'] / r['predicted_compute']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).with_name("measure.md")))
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args(argv)
    rows = []
    for devices, cost, hierarchical in CASES:
        rows.append(run_case(devices, cost, hierarchical, args.steps))
        print(rows[-1].get("error") or f"{devices} {cost}: memory {rows[-1]['measured_memory'] / rows[-1]['predicted_memory']:.2f}, "
              f"compute {rows[-1]['measured_compute'] / rows[-1]['predicted_compute']:.2f}", flush=True)
    text = table(rows)
    print(text)
    out = Path(args.out)
    old = out.read_text() if out.exists() else f"{START}\n{END}\n"
    if START not in old or END not in old:
        old = f"{old.rstrip()}\n\n{START}\n{END}\n"
    head, rest = old.split(START, 1)
    out.write_text(f"{head}{START}\n{text}\n{END}{rest.split(END, 1)[1]}")  # the text around the table stays
    return 0


if __name__ == "__main__":
    sys.exit(main())
