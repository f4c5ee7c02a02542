"""Processes for the tests that stop, kill and time out ranks: who is a child of whom, from /proc."""

from __future__ import annotations

import os
import time
from pathlib import Path


def children(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (zombies excluded), from /proc."""
    parent_of = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            parent_of[int(entry.name)] = int(fields[1])
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent_of.items() if pp == p]
        out += kids
        frontier += kids
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def ranks_of(pid: int, count: int, timeout: float = 120.0) -> list[int]:
    """The pids of the ``count`` rank processes ``pid`` spawned (waits until they exist)."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        found = [c for c in children(pid) if b"spawn_main" in _cmdline(c)]
        if len(found) >= count:
            return sorted(found)
        time.sleep(0.2)
    raise AssertionError(f"process {pid} did not start {count} ranks within {timeout} s")


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    """The pids still alive after waiting up to ``timeout`` seconds."""
    until = time.monotonic() + timeout
    while time.monotonic() < until and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def kill_all(pids: list[int]) -> None:
    """Clean up after a failed test: SIGKILL what is left (only the pids given)."""
    import signal

    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
