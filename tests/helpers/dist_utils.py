"""Run a function on N ranks for tests: threads on torch's threaded process group, or gloo processes.

Threads are the fast path (no interpreter start-up per rank, which matters on a 2-core CI box);
``autopar.runtime.launch`` is the real thing and a few tests use it so that gloo itself is exercised.

Seeded RNG is process-global, so a test builds its model and inputs once, before the threads
start, and hands each rank its own deep copy.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.multi_threaded_pg import (
    ProcessLocalGroup,
    _install_threaded_pg,
    _uninstall_threaded_pg,
)

TIMEOUT_S = 120.0  # a deadlocked collective must fail the test, not hang CI


def run_threaded(fn: Callable, world_size: int, *args: Any) -> list:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` threads of one threaded PG.

    Returns the per-rank results; re-raises the first rank's exception with every failing
    rank's traceback in the message.
    """
    results: list[Any] = [None] * world_size
    errors: dict[int, str] = {}
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    _install_threaded_pg()
    store = dist.HashStore()

    def worker(rank: int) -> None:
        dist.init_process_group("threaded", rank=rank, world_size=world_size, store=store)
        try:
            results[rank] = fn(rank, world_size, *args)
        except BaseException as ex:
            errors[rank] = traceback.format_exc()
            ProcessLocalGroup.exception_handle(ex)  # wake ranks waiting in a collective
        finally:
            dist.destroy_process_group()

    threads = [threading.Thread(target=worker, args=(r,), daemon=True) for r in range(world_size)]
    try:
        for t in threads:
            t.start()
        for r, t in enumerate(threads):
            t.join(TIMEOUT_S)
            if t.is_alive():
                errors.setdefault(r, f"rank {r} did not finish within {TIMEOUT_S} s")
    finally:
        ProcessLocalGroup.reset()
        _uninstall_threaded_pg()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
    if errors:
        text = "\n".join(f"--- rank {r} ---\n{e}" for r, e in sorted(errors.items()))
        raise AssertionError(f"{len(errors)} of {world_size} ranks failed:\n{text}")
    return results


def run_gloo(fn: Callable, world_size: int, *args: Any) -> list:
    """Call ``fn(rank, world_size, *args)`` on real gloo processes (``fn`` must pickle)."""
    from autopar.runtime.launch import LaunchError, launch

    try:
        return launch(fn, world_size, *args, timeout=TIMEOUT_S * 2)
    except LaunchError as e:  # the one line a user sees, and the ranks' tracebacks a test wants
        raise AssertionError(f"{e}\n{e.details}") from None


def _ensure_importable() -> None:
    """Rank processes unpickle test helpers by module name; make ``tests.*`` resolvable."""
    root = str(Path(__file__).resolve().parents[2])  # the repository: tests/helpers/dist_utils.py
    if root not in sys.path:
        sys.path.insert(0, root)


_ensure_importable()
