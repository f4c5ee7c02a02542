"""``keep_freed_memory``: a buffer a step frees is reused by the next step, not faulted in afresh.

Counted with the kernel's own page-fault counter (``getrusage``'s minor faults) in a fresh
process per case (the setting is process-wide): a 40 MiB tensor allocated, filled and freed eight
times, the last four counted. glibc maps a request that large afresh every time (over its largest dynamic mmap threshold,
32 MiB), so each round faults in all of its ~10,000 pages; with the setting, the heap's pages are
reused once the heap has settled (one of the first three rounds may still grow it).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import resource, sys, torch
from autopar.runtime.allocator import keep_freed_memory
took = keep_freed_memory() if sys.argv[1] == "keep" else None
faults = []
for _ in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.empty(10 * 2**20, dtype=torch.float32).fill_(1.0)
    del x
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(took, sum(faults[4:]))
"""


def _faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True, timeout=120)
    took, faults = out.stdout.split()
    return took, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_freed_memory_is_reused_instead_of_faulted_in_each_step():
    _, default = _faults("default")
    took, kept = _faults("keep")
    pages = 4 * 40 * 2**20 // 4096  # the last four rounds' 40 MiB each
    assert took == "True"
    assert default >= 0.9 * pages, default  # glibc's own settings: every round maps and faults afresh
    assert kept <= 0.05 * pages, kept
