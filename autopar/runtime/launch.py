"""Run a function on N local CPU processes joined by a gloo process group.

For examples, tests and ``autopar run``: ``launch(fn, 2, *args)`` starts two processes, each
calling ``fn(rank, world_size, *args)`` inside an initialized gloo group, and returns their return
values in rank order. Under ``torchrun`` none of this is needed (the sharded module only wants an
initialized default group); this exists so that a laptop or CI box can run a real multi-process
plan from one Python call.

What a user sees when something goes wrong is one line naming the rank and the cause, and no
process left behind: the first rank that fails (an exception, a signal, the out-of-memory killer)
ends the run at once, since its peers would otherwise wait in a collective for gloo's 30-minute
timeout; ``timeout`` bounds the whole run, also when a rank is stopped (SIGSTOP), which no
collective ever notices; SIGTERM to the caller ends the ranks before it returns; and each rank
dies with the launcher (a thread waits on it, ``_die_with_parent``), so even a SIGKILLed caller
leaves no orphans.
torch's own ``ProcessContext.join`` is not used for this: on a failure it terminates the other
ranks and then joins them without a limit, which never returns for a stopped rank.

Why a fork server (not fork, not a fresh spawn): torch's intra-op thread pools and gloo do not
survive a fork of a process that has used them, and a spawned rank spends 1.5-3 s importing torch
before it does anything (a 2-rank launch took 3 s end to end, a 4-rank one 6 s on the benchmarks' machine).
multiprocessing's fork server is a clean process that imports torch once, before any thread
exists, and forks every rank from there (a no-op launch: 0.09 s for 2 ranks, 0.15 s for 4, after
the server's own start of about 2 s, once per launching process). A rank gets the
launcher's environment as it is at the launch (the server's own is from when it started).
Why a fresh free port per call: several launches may run at once on one machine (parallel test
workers, other users); a fixed port would make them collide.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from autopar.core.errors import AutoparError
from autopar.runtime.allocator import keep_freed_memory

GRACE_S = 3.0  # how long the other ranks get to report their own error before they are ended
# errors a rank raises because a peer went away: not the cause, when a peer's own failure is known
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "timed out",
              "Timed out", "ECONNRESET", "EPIPE", "Connection refused", "SIGTERM")


class LaunchError(AutoparError, RuntimeError):
    """The run failed: the message is one line naming the rank and the cause; ``details`` holds
    every failing rank's traceback text (for a programmer; the command line prints the line)."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details


class Terminated(BaseException):
    """SIGTERM reached the process that launched the ranks; they have been ended."""


@dataclass(frozen=True)
class _Job:
    # the file holding ``(fn, args)`` pickled by value, which each rank reads: multiprocessing's
    # pickler (torch's reductions) would pass every tensor in them as a file descriptor, and the
    # fork server takes at most 253 in one message (SCM_MAX_FD: a sweep of 8 small GPTs failed
    # with "Invalid argument"); and a large process object written down the rank's start pipe
    # breaks that pipe when the rank ends early (a script without its __main__ guard)
    call: str
    world_size: int
    addr: str
    port: int
    threads: int
    parent: int  # the launching process: a rank whose parent is gone ends itself
    env: dict  # the launcher's environment at the launch
    keep_memory: bool = True  # ``allocator.keep_freed_memory`` in each rank


@dataclass
class _Outcome:
    ok: dict[int, Any] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)  # rank -> traceback text


def free_port(addr: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _die_with_parent(launcher: int) -> None:
    """End this rank when the launcher dies, however it dies (SIGKILL included).

    The rank's parent is the fork server, not the launcher, and the server outlives a killed
    launcher while ranks hold its liveness pipe (multiprocessing hands it to every child): so a
    thread of the rank waits on the launcher itself (a pidfd, Linux 5.3+; else a poll each
    second) and SIGKILLs the rank when it is gone. The kernel's PR_SET_PDEATHSIG (the server's
    death) is asked for too."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if not _alive(launcher):  # it died before the watch began
        os._exit(1)
    threading.Thread(target=_watch_launcher, args=(launcher,), name="autopar-launcher-watch",
                     daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _watch_launcher(pid: int) -> None:
    try:
        import select

        fd = os.pidfd_open(pid)
        select.select([fd], [], [])  # readable once the process has exited
    except (AttributeError, OSError):
        while _alive(pid):
            time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)


def _worker(rank: int, job: _Job, results) -> None:
    _die_with_parent(job.parent)
    os.environ.clear()
    os.environ.update(job.env)
    os.environ.update(MASTER_ADDR=job.addr, MASTER_PORT=str(job.port),
                      RANK=str(rank), WORLD_SIZE=str(job.world_size))
    import torch

    torch.set_num_threads(job.threads)  # N processes share the cores: no oversubscription
    if job.keep_memory:
        keep_freed_memory()  # a step's buffers stay mapped for the next step (runtime/allocator.py)
    _thread_lock_for_tqdm()
    dist.init_process_group("gloo", rank=rank, world_size=job.world_size)
    try:
        with open(job.call, "rb") as f:
            fn, args = pickle.load(f)
        out = fn(rank, job.world_size, *args)
        # pickled here, by value: torch's multiprocessing pickler would send a tensor as a
        # file descriptor that the launcher fetches from this process, which may have exited
        results.send((rank, "ok", pickle.dumps(out)))
        # no rank tears gloo down while another still has a collective in flight (that aborts it)
        dist.barrier()
    except BaseException:
        # the text travels: exception objects themselves may not pickle
        results.send((rank, "error", traceback.format_exc()))
        raise SystemExit(1) from None  # the traceback went to the parent, not to stderr
    finally:
        dist.destroy_process_group()


def _thread_lock_for_tqdm() -> None:
    """torch.fx's Interpreter makes a (disabled) tqdm bar, whose first use creates a
    multiprocessing lock: a named semaphore that a rank ended by SIGTERM (Ctrl-C, a failing
    peer) never unlinks, and the resource tracker reports as leaked. A rank's bars are never
    shared with another process: a thread lock does."""
    try:
        from tqdm import tqdm
    except ImportError:
        return
    tqdm.set_lock(threading.RLock())


# a rank that was about to re-run the launching script's top level exits with this code, silently
UNGUARDED_EXIT = 87
UNGUARDED = ("the processes autopar started ran this script's top level again (Python's multiprocessing "
             "imports the main script in each one): put the code that plans and trains under "
             "`if __name__ == \"__main__\":`")


def exit_if_bootstrapping() -> None:
    """End this process quietly when it is a new process still importing the launching script.

    Python's multiprocessing (spawn, fork server) imports the main script in every process it
    starts; a script whose top level calls ``launch`` or ``compile_many`` without the
    ``if __name__ == "__main__":`` guard would plan again in each, print its report again, and die
    in multiprocessing's "bootstrapping phase" RuntimeError. The launcher reads the exit code and
    says what to do in one line (``UNGUARDED``)."""
    import multiprocessing

    if getattr(multiprocessing.current_process(), "_inheriting", False):  # multiprocessing's own test
        os._exit(UNGUARDED_EXIT)


def launch(fn: Callable, nprocs: int, *args: Any, threads: int = 1, addr: str = "127.0.0.1",
           timeout: float | None = None, keep_memory: bool = True) -> list:
    """Run ``fn(rank, nprocs, *args)`` on ``nprocs`` gloo processes; return results by rank.

    ``fn``, ``args`` and the results must pickle (``fn`` a module-level function). A failing
    rank (an exception, a signal) ends every rank and raises ``LaunchError`` (one line: the rank
    and the cause; ``.details``: the tracebacks). With ``timeout`` (seconds), ranks still running
    then (a deadlocked collective, a stopped process) are ended and ``LaunchError`` raised. SIGTERM
    to this process, or Ctrl-C, ends the ranks and raises ``Terminated`` / ``KeyboardInterrupt``.
    Each rank keeps the host memory a step frees for the next step (``keep_memory``:
    ``runtime/allocator.py``), as a device's caching allocator does.
    """
    exit_if_bootstrapping()
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"launch: nprocs must be a positive int, not {nprocs!r}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"launch: timeout must be a positive number of seconds, not {timeout!r}")
    ctx = _context()
    # one pipe per rank, not a multiprocessing queue: a queue's locks are named semaphores, which
    # a run ended by Ctrl-C left for the resource tracker to report as leaked
    pipes = [ctx.Pipe(duplex=False) for _ in range(nprocs)]
    results = _Results([r for r, _ in pipes])
    fd, path = tempfile.mkstemp(prefix="autopar-launch-", suffix=".pickle")
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump((fn, tuple(args)), f)
        job = _Job(path, nprocs, addr, free_port(addr), threads, os.getpid(), dict(os.environ), keep_memory)
        procs = [ctx.Process(target=_worker, args=(r, job, w), name=f"autopar-rank-{r}")
                 for r, (_, w) in enumerate(pipes)]
        found = _Outcome()
        with _ending(procs), results:
            with _ctrl_c_for_the_launcher_only():
                for p in procs:
                    p.start()
            for _, w in pipes:
                w.close()  # the ranks hold their own ends
            _watch(procs, results, found, None if timeout is None else time.monotonic() + timeout, timeout)
    finally:
        os.unlink(path)  # every rank has ended
    return [found.ok.get(r) for r in range(nprocs)]


PRELOAD = ["torch", "torch.distributed", "torch.distributed.tensor", "autopar", "autopar.codegen.module"]


def _context():
    """The fork server where the platform has one (Linux, macOS), else spawn."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


@contextlib.contextmanager
def _ending(procs):
    """End the ranks however the block is left; SIGTERM becomes ``Terminated`` meanwhile."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None

    def on_term(signum, frame):
        raise Terminated("stopped by SIGTERM")

    if main:
        signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        try:
            _end(procs)
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _ctrl_c_for_the_launcher_only():
    """Start processes with SIGINT ignored. Ctrl-C goes to the terminal's whole foreground group:
    the fork server (started by the first launch) and every rank would each print a
    KeyboardInterrupt traceback. A process started with SIGINT ignored keeps it ignored (Python
    installs its handler only where SIGINT is not ignored), and the fork server hands that on to
    the ranks it forks; only the launcher gets the KeyboardInterrupt, and ``_ending`` ends them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _watch(procs, results, found: _Outcome, deadline: float | None, timeout: float | None) -> None:
    while True:
        _drain(results, found)
        failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if failed or found.errors:
            _settle(procs, results, found)
            raise LaunchError(_cause(procs, found), _details(found))
        if all(p.exitcode == 0 for p in procs):
            return
        if deadline is not None and time.monotonic() > deadline:
            states = {r: _state(p.pid) for r, p in enumerate(procs) if p.exitcode is None}
            _end(procs)
            _drain(results, found)
            raise LaunchError(_late(states, timeout), _details(found))
        alive = [p.sentinel for p in procs if p.exitcode is None]
        wait(alive, timeout=0.2)


def _settle(procs, results, found: _Outcome) -> None:
    """Give the other ranks a moment to report their own errors, then end them."""
    until = time.monotonic() + GRACE_S
    while time.monotonic() < until and any(p.exitcode is None for p in procs):
        wait([p.sentinel for p in procs if p.exitcode is None], timeout=0.2)
        _drain(results, found)
    _end(procs)
    _drain(results, found)


def _cause(procs, found: _Outcome) -> str:
    """One line: the rank whose failure started it and why, then how many others followed."""
    if any(p.exitcode == UNGUARDED_EXIT for p in procs):
        return UNGUARDED
    causes = []
    for r, p in enumerate(procs):
        code = p.exitcode
        if r in found.errors:
            line = _last_line(found.errors[r])
            rank_of = 1 if any(s in line for s in _PEER_GONE) else 0
            causes.append((rank_of, r, f"rank {r} failed: {line}"))
        elif code is not None and code < 0 and getattr(p, "_ended_by_us", False) is False:
            causes.append((0, r, f"rank {r} was killed by {_signal_name(-code)}"
                           + (" (the kernel's out-of-memory killer sends SIGKILL: is memory short?)"
                              if -code == signal.SIGKILL else "")))
        elif code not in (None, 0) and code > 0:
            causes.append((1, r, f"rank {r} exited with code {code}"))
    if not causes:
        return "a rank failed without saying why"
    causes.sort()
    first = causes[0][2]
    others = len(causes) - 1
    return first + (f"; {others} other rank(s) failed after it" if others else "") + "; every rank was ended"


def _late(states: dict[int, str], timeout: float | None) -> str:
    stopped = [r for r, s in states.items() if s == "T"]
    what = []
    if stopped:
        what.append(f"rank{'s' if len(stopped) > 1 else ''} {', '.join(map(str, stopped))} "
                    f"{'were' if len(stopped) > 1 else 'was'} stopped (SIGSTOP or Ctrl-Z) and never resumed")
    running = [r for r in states if r not in stopped]
    if running:
        what.append(f"rank{'s' if len(running) > 1 else ''} {', '.join(map(str, running))} still running "
                    "(waiting on a peer, or slower than the timeout)")
    return (f"the run did not finish within its {timeout:g} s timeout: " + "; ".join(what)
            + "; every rank was ended (raise --timeout for a longer run)")


def _state(pid: int) -> str:
    """The process's state letter from /proc (R, S, T for stopped, ...), '?' where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1].strip() if lines else "an error without a message"


def _details(found: _Outcome) -> str:
    return "\n".join(f"--- rank {r} ---\n{t}" for r, t in sorted(found.errors.items()))


def _end(procs) -> None:
    """End the ranks this launch started (and only them): SIGTERM, then SIGKILL, then reap."""
    alive = [p for p in procs if p.pid is not None and p.exitcode is None]
    for p in alive:
        p._ended_by_us = True
        with contextlib.suppress(OSError):
            p.terminate()
            os.kill(p.pid, signal.SIGCONT)  # a stopped rank acts on SIGTERM only once continued
    until = time.monotonic() + 2.0
    for p in alive:
        p.join(max(0.0, until - time.monotonic()))
    for p in alive:
        if p.exitcode is None:
            with contextlib.suppress(OSError):
                p.kill()
            p.join()


class _Results:
    """The read ends of the ranks' pipes; each rank sends one (rank, status, value) message."""

    def __init__(self, readers: list) -> None:
        self.readers = list(readers)

    def messages(self):
        for conn in list(self.readers):
            try:
                while conn.poll():
                    yield conn.recv()
            except (EOFError, OSError):  # the rank exited: nothing more comes on this pipe
                self.readers.remove(conn)
                conn.close()

    def __enter__(self) -> "_Results":
        return self

    def __exit__(self, *exc) -> None:
        for conn in self.readers:
            conn.close()


def _drain(results: _Results, found: _Outcome) -> None:
    for rank, status, value in results.messages():
        if status == "ok":
            found.ok[rank] = pickle.loads(value)
        else:
            found.errors[rank] = value
