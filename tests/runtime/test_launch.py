"""``autopar.runtime.launch``: a failing child's traceback reaches the caller (no hang, no silence); more
failure cases (stopped, killed, out of memory) in test_launch_failures.py."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from autopar.runtime.launch import LaunchError, launch


def fail_on_rank_one(rank, world):
    if rank == 1:
        raise ValueError("boom on rank one")
    dist.barrier()  # rank 0 waits for a peer that has died: gloo must give up, not hang


@pytest.mark.dist
def test_child_exception_propagates_with_its_traceback():
    with pytest.raises(LaunchError) as e:
        launch(fail_on_rank_one, 2, timeout=120)
    assert str(e.value).startswith("rank 1 failed: ValueError: boom on rank one")  # one line, for a user
    text = e.value.details
    assert "--- rank 1 ---" in text and "ValueError: boom on rank one" in text
    assert "fail_on_rank_one" in text  # the child's own frames, not just the parent's


@pytest.mark.parametrize("nprocs", [0, -1, 1.5])
def test_nprocs_must_be_a_positive_int(nprocs):
    """launch(fn, 0) returned [] without running anything."""
    with pytest.raises(ValueError, match="nprocs must be a positive int"):
        launch(print, nprocs)


def read_env(rank, world, name):
    import os

    return os.environ.get(name)


@pytest.mark.dist
def test_each_launch_sees_the_launchers_environment_of_that_moment(monkeypatch):
    """The ranks are forked from a fork server started at the first launch: without the
    environment carried in the job they would see the server's (from its start), not the
    launcher's of now."""
    monkeypatch.setenv("AUTOPAR_LAUNCH_PROBE", "first")
    first = launch(read_env, 2, "AUTOPAR_LAUNCH_PROBE", timeout=120)
    monkeypatch.setenv("AUTOPAR_LAUNCH_PROBE", "second")
    second = launch(read_env, 2, "AUTOPAR_LAUNCH_PROBE", timeout=120)
    monkeypatch.delenv("AUTOPAR_LAUNCH_PROBE")
    third = launch(read_env, 2, "AUTOPAR_LAUNCH_PROBE", timeout=120)
    assert first == ["first"] * 2
    assert second == ["second"] * 2
    assert third == [None] * 2


def total(rank, world, tensors):
    return float(sum(t.sum() for t in tensors))


@pytest.mark.dist
def test_arguments_holding_hundreds_of_tensors_reach_the_ranks():
    """A fork server takes at most 253 file descriptors per message, and multiprocessing's pickler
    sends each tensor as one: ``autopar sweep``'s 8 GPTs ended in "Invalid argument"."""
    import torch

    tensors = [torch.full((3,), float(i)) for i in range(300)]
    assert launch(total, 2, tensors, timeout=120) == [3.0 * sum(range(300))] * 2


@pytest.mark.dist
def test_a_script_without_the_main_guard_gets_one_line_saying_so(tmp_path):
    """multiprocessing imports the main script in every rank: unguarded, each rank re-ran the
    top level, printed it again, and died in the "bootstrapping phase" RuntimeError."""
    import os
    import subprocess
    import sys

    script = tmp_path / "unguarded.py"
    # a large argument (1 MiB, as a model is): it once broke the pipe that starts a rank, which
    # a rank ending early closes, before the ranks' exit codes were read
    script.write_text("from autopar.runtime.launch import launch\nprint(launch(max, 2, bytes(2 ** 20)))\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 1
    assert r.stdout == ""
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("autopar.runtime.launch.LaunchError: ") and 'if __name__ == "__main__":' in last
    assert "bootstrapping" not in r.stderr and r.stderr.count("Traceback") == 1, r.stderr
    script.write_text("from autopar.runtime.launch import launch\nif __name__ == '__main__':\n"
                      "    print(launch(max, 2))\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0 and r.stdout == "[2, 2]\n", r.stderr
