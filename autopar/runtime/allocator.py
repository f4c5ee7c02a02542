"""Host memory a training step frees stays in the process for the next step (glibc malloc).

glibc serves a request above its mmap threshold (128 KiB at start, raised as mapped blocks are
freed) with a fresh mapping, and hands the top of its heap back to the system once more than its
trim threshold is free there. A training step on the CPU frees its activations, gathered shards
and gradients and allocates them again in the next step, so whichever of them glibc mapped afresh
have every page faulted in again, each step: on the benchmarks' machine (benchmarks/README.md) a
fresh 1 MiB gather took 0.83 ms of this process's CPU time where the same gather into memory the
process already held took 0.07 ms; which buffers are hit depends on the order of earlier frees, so
the same program pays it in one process and not in the next. A device's caching allocator (CUDA's)
keeps freed blocks for reuse, and the cost models price a step that way.

``keep_freed_memory`` fixes glibc's mmap threshold at 64 MiB and its trim threshold at 128 MiB
(``mallopt``), so buffers under 64 MiB come from the heap and stay mapped between steps. autopar's
CPU ranks (``runtime.launch``) and ``autopar measure`` call it; elsewhere (another libc, macOS)
it does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 64 * 2**20
TRIM_THRESHOLD = 128 * 2**20


def keep_freed_memory() -> bool:
    """Keep freed blocks under 64 MiB in this process (glibc); True where the settings took."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
