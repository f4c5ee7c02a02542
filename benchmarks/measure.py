"""One rank of the zoo gpt's and a small HF Llama's plans for 8, 64 and 512 devices, measured on
this CPU beside the plan.

    .venv/bin/python -m benchmarks.measure [--out benchmarks/measure.md] [--steps 6] [--models gpt,llama]

Each case runs ``autopar measure`` in a fresh process (one rank over torch's fake process group,
one thread: a device of the ``cpu`` preset): flat-mesh plans with the profiled cost model (rank
0), and the hierarchical plan for 512 devices (the analytic model's terms; pipelined: rank 0 and
the first rank of the fullest stage; ZeRO off, which codegen runs on single-stage plans only); the
table of measured/predicted peak memory and compute per step (communication's local work timed
apart: ``autopar/cli/measure_comm.py``) is written as markdown, with the load average before and
after each case.
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
MODELS = {"gpt": f"zoo:gpt:{SIZES}", "llama": "benchmarks/llama_small.py:factory"}
START, END = "<!-- table: benchmarks/measure.py -->", "<!-- end of table -->"
def cases(flat_cost: str) -> list[tuple[int, str, str, str]]:
    """(devices, cost model, --hierarchical, --rank) of each row."""
    return ([(n, flat_cost, "off", "0") for n in (8, 64, 512)]
            + [(512, "analytic", "auto", "0"), (512, "analytic", "auto", "fullest")])


def run_case(model: str, devices: int, cost: str, hierarchical: str, rank: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "m.json"
        cmd = [sys.executable, "-m", "autopar", "measure", MODELS[model], "--devices", str(devices), "--rank", rank,
               "--cost-model", cost, "--hierarchical", hierarchical, "--steps", str(steps), "--json", str(out)]
        if hierarchical == "auto":  # codegen runs ZeRO on single-stage plans only
            cmd[-2:-2] = ["--zero", "0"]
        load = [os.getloadavg()[0]]
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                           timeout=1800)
        load.append(os.getloadavg()[0])
        shown = " ".join(c for c in cmd[1:] if c != str(out)).replace(" --json", "")
        common = dict(model=model, cost=cost, hierarchical=hierarchical, command=shown, load=load, asked=rank)
        if r.returncode != 0:
            return dict(common, devices=devices, error=r.stderr.strip().splitlines()[-1])
        return dict(json.loads(out.read_text()), **common)


HEADER = ("| model | devices | cost model | plan | rank | memory measured (MiB) | predicted (MiB) | ratio | "
          "compute measured (ms) | predicted (ms) | ratio | load |\n|---|---|---|---|---|---|---|---|---|---|---|---|")


def mib(x: float) -> str:
    return f"{x / 2**20:.1f}"


def table(rows: list[dict]) -> str:
    lines = [HEADER]
    for r in rows:
        plan = "hierarchical (auto)" if r["hierarchical"] == "auto" else "flat mesh, one stage"
        load = "-".join(f"{x:.1f}" for x in r["load"])
        if "error" in r:
            why = r["error"].removeprefix("autopar: error: ")
            lines.append(f"| {r['model']} | {r['devices']} | {r['cost']} | {plan} | {r['asked']} | failed: {why} "
                         f"||||||| {load} |")
            continue
        rank = f"{r['rank']}" + (" (fullest stage)" if r["asked"] == "fullest" else "")
        lines.append(f"| {r['model']} | {r['devices']} | {r['cost']} | {plan} | {rank} | {mib(r['measured_memory'])} | "
                     f"{mib(r['predicted_memory'])} | {r['measured_memory'] / r['predicted_memory']:.2f} | "
                     f"{r['measured_compute'] * 1e3:.1f} | {r['predicted_compute'] * 1e3:.1f} | "
                     f"{r['measured_compute'] / r['predicted_compute']:.2f} | {load} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).with_name("measure.md")))
    p.add_argument("--steps", type=int, default=6, help="training steps per row, the first a warm-up")
    p.add_argument("--models", default="gpt,llama")
    p.add_argument("--flat-cost", default="profiled", choices=["profiled", "analytic"],
                   help="cost model of the flat-mesh rows (the hierarchical ones price with the analytic terms)")
    p.add_argument("--append", action="store_true", help="keep the table's rows and add these")
    args = p.parse_args(argv)
    rows, out = [], Path(args.out)
    earlier = table_rows(out) if args.append else []
    for model in args.models.split(","):
        for devices, cost, hierarchical, rank in cases(args.flat_cost):
            rows.append(run_case(model, devices, cost, hierarchical, rank, args.steps))
            r = rows[-1]
            print(r.get("error") or f"{model} {devices} {cost} {hierarchical} rank {r['rank']}: memory "
                  f"{r['measured_memory'] / r['predicted_memory']:.2f}, compute "
                  f"{r['measured_compute'] / r['predicted_compute']:.2f}", flush=True)
            write(out, table(rows), earlier)  # after every row: a stopped run keeps its rows
    print(table(rows))
    return 0


def table_rows(out: Path) -> list[str]:
    """The rows of the table already in ``out`` (past its header)."""
    text = out.read_text() if out.exists() else ""
    if START not in text or END not in text:
        return []
    kept = text.split(START, 1)[1].split(END, 1)[0]
    return [x for x in kept.strip().splitlines()[2:] if x.startswith("|")]


def write(out: Path, text: str, earlier: list[str]) -> None:
    """The table in ``out`` between its markers, after the rows ``earlier`` (the text around stays)."""
    old = out.read_text() if out.exists() else f"{START}\n{END}\n"
    if START not in old or END not in old:
        old = f"{old.rstrip()}\n\n{START}\n{END}\n"
    head, rest = old.split(START, 1)
    tail = rest.split(END, 1)[1]
    lines = text.splitlines()
    text = "\n".join([*lines[:2], *earlier, *lines[2:]])
    out.write_text(f"{head}{START}\n{text}\n{END}{tail}")


if __name__ == "__main__":
    sys.exit(main())
