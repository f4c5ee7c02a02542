"""Run a function on N local CPU processes joined by a gloo process group.

For examples and tests: ``launch(fn, 2, *args)`` spawns two processes, each calling
``fn(rank, world_size, *args)`` inside an initialized gloo group, and returns their return values
in rank order. Under ``torchrun`` none of this is needed (the sharded module only wants an
initialized default group); this exists so that a laptop or CI box can run a real multi-process
plan from one Python call.

Why spawn (not fork): torch's intra-op thread pools and gloo do not survive a fork reliably.
Why a fresh free port per call: several launches may run at once on one machine (parallel test
workers, other users); a fixed port would make them collide.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException


class LaunchError(RuntimeError):
    """A child process failed; the message holds its rank and traceback text."""


@dataclass(frozen=True)
class _Job:
    fn: Callable
    world_size: int
    addr: str
    port: int
    args: tuple
    threads: int


def free_port(addr: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _worker(rank: int, job: _Job, results) -> None:
    os.environ.update(MASTER_ADDR=job.addr, MASTER_PORT=str(job.port),
                      RANK=str(rank), WORLD_SIZE=str(job.world_size))
    import torch

    torch.set_num_threads(job.threads)  # N processes share the cores: no oversubscription
    dist.init_process_group("gloo", rank=rank, world_size=job.world_size)
    try:
        out = job.fn(rank, job.world_size, *job.args)
        results.put((rank, "ok", out))
        # no rank tears gloo down while another still has a collective in flight (that aborts it)
        dist.barrier()
    except BaseException:
        # the text travels: exception objects themselves may not pickle
        results.put((rank, "error", traceback.format_exc()))
        raise
    finally:
        dist.destroy_process_group()


def launch(fn: Callable, nprocs: int, *args: Any, threads: int = 1, addr: str = "127.0.0.1",
           timeout: float | None = None) -> list:
    """Run ``fn(rank, nprocs, *args)`` on ``nprocs`` gloo processes; return results by rank.

    ``fn``, ``args`` and the results must pickle (``fn`` a module-level function). A failure in
    any child raises ``LaunchError`` carrying the child's traceback. With ``timeout`` (seconds),
    children still running then (a deadlocked collective) are terminated and ``LaunchError``
    raised, so that a test fails instead of hanging.
    """
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"launch: nprocs must be a positive int, not {nprocs!r}")
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    job = _Job(fn, nprocs, addr, free_port(addr), tuple(args), threads)
    procs = mp.start_processes(_worker, args=(job, results), nprocs=nprocs, join=False,
                               start_method="spawn")
    found: dict[str, dict[int, Any]] = {"ok": {}, "error": {}}
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        # read while waiting: a child blocks on a full pipe until the parent drains it
        while not procs.join(timeout=0.2):
            _drain(results, found)
            if deadline is not None and time.monotonic() > deadline:
                _stop(procs)
                raise LaunchError(f"{nprocs} processes still running after {timeout} s; stopped")
    except ProcessException as e:
        _drain(results, found)
        detail = "\n".join(f"--- rank {r} ---\n{t}" for r, t in sorted(found["error"].items()))
        raise LaunchError(f"{e}\n{detail}" if detail else str(e)) from None
    _drain(results, found)
    return [found["ok"].get(r) for r in range(nprocs)]


def _stop(procs) -> None:
    """Terminate the children this launch started (and only them)."""
    for p in procs.processes:
        if p.is_alive():
            p.terminate()
    for p in procs.processes:
        p.join(5)


def _drain(results, found: dict[str, dict[int, Any]]) -> None:
    while not results.empty():
        rank, status, value = results.get()
        found[status][rank] = value
