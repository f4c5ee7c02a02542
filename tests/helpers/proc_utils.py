"""Processes for the tests that stop, kill and time out ranks: whether they are gone, from /proc."""

from __future__ import annotations

import os
import time
from pathlib import Path


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    """The pids still alive after waiting up to ``timeout`` seconds."""
    until = time.monotonic() + timeout
    while time.monotonic() < until and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def kill_all(pids: list[int]) -> None:
    """Clean up after a failed test: SIGKILL what is left (only the pids given)."""
    import signal

    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
