"""``autopar.runtime.launch`` when a rank fails: one line naming the rank and the cause, within the
timeout, and no rank process left behind.

Before: a stopped rank (SIGSTOP) hung the run forever, also with a timeout (torch's join
terminates the other ranks, then joins the stopped one without a limit); a killed rank gave a
multi-line traceback without the cause. Each rank writes its pid first, so the test can check
that every one of them is gone afterwards.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from autopar.runtime.launch import LaunchError, launch

from tests.helpers.proc_utils import kill_all, wait_gone


def _note_pid(folder: str, rank: int) -> None:
    Path(folder, f"rank{rank}.pid").write_text(str(os.getpid()))


def _pids(folder: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted(folder.glob("rank*.pid"))]


def stop_rank_one(rank, world, folder):
    _note_pid(folder, rank)
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    dist.barrier()  # rank 0 waits here for a peer that never comes


def kill_rank_one(rank, world, folder):
    _note_pid(folder, rank)
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def exhaust_memory_on_rank_one(rank, world, folder):
    import resource

    _note_pid(folder, rank)
    dist.barrier()
    if rank == 1:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, hard))  # as a memory-limited machine
        torch.ones(2**33)  # 32 GiB
    dist.barrier()


def fail_on_rank_one(rank, world, folder):
    _note_pid(folder, rank)
    if rank == 1:
        raise ValueError("boom on rank one")
    dist.barrier()  # rank 0 waits for a peer that has died: the launch must end it, not gloo


def _ends(fn, tmp_path, timeout):
    start = time.monotonic()
    try:
        with pytest.raises(LaunchError) as e:
            launch(fn, 2, str(tmp_path), timeout=timeout)
        took = time.monotonic() - start
        left = wait_gone(_pids(tmp_path), timeout=5)
        assert not left, f"rank processes {left} survived the launch"
    finally:
        kill_all(_pids(tmp_path))
    message = str(e.value)
    assert "\n" not in message, message
    return message, took, e.value


@pytest.mark.slow
@pytest.mark.dist
def test_a_stopped_rank_ends_the_run_at_the_timeout(tmp_path):
    message, took, _ = _ends(stop_rank_one, tmp_path, timeout=6)
    assert "rank 1 was stopped" in message and "6 s timeout" in message
    assert took < 6 + 20  # the timeout plus start-up and the ending of the ranks, not forever


@pytest.mark.dist
def test_a_killed_rank_ends_the_run_at_once_and_names_the_signal(tmp_path):
    message, took, _ = _ends(kill_rank_one, tmp_path, timeout=120)
    assert message.startswith("rank 1 was killed by SIGKILL"), message
    assert "out-of-memory" in message
    assert took < 60  # not the 120 s timeout, nor gloo's own 30 minutes


@pytest.mark.dist
def test_a_rank_out_of_memory_says_so_in_one_line(tmp_path):
    message, _, _ = _ends(exhaust_memory_on_rank_one, tmp_path, timeout=120)
    assert message.startswith("rank 1 failed: RuntimeError:") and "allocate" in message, message


@pytest.mark.dist
def test_a_rank_exception_is_one_line_and_its_traceback_travels(tmp_path):
    message, took, error = _ends(fail_on_rank_one, tmp_path, timeout=120)
    assert message.startswith("rank 1 failed: ValueError: boom on rank one"), message
    assert "--- rank 1 ---" in error.details and "fail_on_rank_one" in error.details  # the child's frames
    assert took < 60


def test_timeout_must_be_positive():
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        launch(print, 1, timeout=0)


LAUNCHER = '''
import os, sys, time
from pathlib import Path


def sleeper(rank, world, folder):
    Path(folder, f"rank{rank}.pid").write_text(str(os.getpid()))
    time.sleep(600)


if __name__ == "__main__":
    from autopar.runtime.launch import launch

    launch(sleeper, 2, sys.argv[1])
'''


@pytest.mark.dist
def test_a_killed_launcher_takes_its_ranks_with_it(tmp_path):
    """SIGKILL to the launching process (no handler runs) must not leave its ranks running: their
    parent is the fork server, which ranks keep alive, so each rank watches the launcher itself."""
    import subprocess
    import sys

    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)])
    try:
        deadline = time.monotonic() + 120
        while len(_pids(tmp_path)) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        pids = _pids(tmp_path)
        assert len(pids) == 2, "the ranks did not start"
        proc.kill()
        proc.wait()
        left = wait_gone(pids, timeout=10)
        assert not left, f"rank processes {left} outlived their SIGKILLed launcher"
    finally:
        proc.kill()
        kill_all(_pids(tmp_path))
