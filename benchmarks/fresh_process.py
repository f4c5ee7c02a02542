"""One benchmark case in a fresh Python process, and what the case reports from inside it.

Planning time and peak memory are only comparable between cases when each case starts from a
bare interpreter: a case run after another would find torch imported, caches warm and the
process's peak resident set already raised. So the planning benchmarks (``scale.py``,
``scale_moe.py``, ``scale_hf.py`` through ``scale.py``, ``plan_speed.py``, ``plan_llama.py``)
run each case as ``python -m benchmarks.<script> --child ...``, which prints its row as JSON on
its last line; ``run_child`` is that call, and ``rss_bytes`` the child's peak.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent  # the children run from the repository's root


def run_child(module: str, args: list[str], case: str | None = None, timeout: float = 900.0,
              one_thread: bool = True) -> dict:
    """``python -m <module> --child <args>`` in a fresh process (``PYTHONHASHSEED=0``, and
    ``OMP_NUM_THREADS=1`` unless ``one_thread`` is False): the JSON row it prints last, or
    ``{"case": case, "error": why}`` when it times out or fails (``case`` left out when None)."""
    env = {**os.environ, "PYTHONHASHSEED": "0", **({"OMP_NUM_THREADS": "1"} if one_thread else {})}
    named = {} if case is None else {"case": case}
    try:
        proc = subprocess.run([sys.executable, "-m", module, "--child", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**named, "error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        return {**named, "error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rss_bytes() -> int:
    """This process's peak resident set so far (``ru_maxrss`` is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def timed(repeat: int, call: Callable[[], Any]) -> tuple[list[float], Any]:
    """Wall seconds of each of ``repeat`` calls of ``call``, and the last call's result."""
    walls, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = call()
        walls.append(time.perf_counter() - start)
    return walls, out


def error_row(row: dict, cells: int) -> str:
    """A table row for a case that failed: its name and error, then ``cells`` empty cells."""
    return f"| {row['case']} | error: {row['error']} |" + " |" * cells


def result_rows(rows: list[dict], cells: int, line) -> list[str]:
    """A table's rows: ``line(row)`` for each case that ran, its ``error_row`` for one that failed."""
    return [error_row(r, cells) if "error" in r else line(r) for r in rows]


def passed(rows: list[dict], test) -> str:
    """"k/n": how many of the cases that ran pass ``test``, out of all the cases."""
    return f"{sum(bool(test(r)) for r in rows if 'error' not in r)}/{len(rows)}"
