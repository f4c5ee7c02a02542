"""Progress on long work (tracing a big model, profiling, a search), shown only on a terminal.

Two shapes, both silent unless their stream is a terminal (or ``enabled=True``), so that logs, pipes
and CI output stay exactly what they were:

* ``Progress(total, label)``: a counted bar, redrawn in place at most every ``min_interval``
  seconds (the last step is always drawn), ending with one line ``"label: done in 1.2 s"``;
* ``phase(label)``: an uncounted status for one blocking call, ``"tracing GPT ..."`` that becomes
  ``"tracing GPT ... 1.2 s"`` (or ``"... failed after 1.2 s"``) when the block ends.

``Progress`` keeps the interface of the profiler's first bar (``Progress(n, label, stream=...,
enabled=...)`` and ``step(what)``), so either can stand in for the other.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from typing import Callable, Iterator, TextIO

__all__ = ["Progress", "Phase", "phase", "is_terminal", "fmt_duration"]


def is_terminal(stream) -> bool:
    """True when ``stream`` is an open terminal; False for files, pipes, StringIO, closed streams."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def fmt_duration(seconds: float) -> str:
    """'0.4 s', '12.3 s', '3 min 05 s', '1 h 02 min'."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    m, s = divmod(int(round(seconds)), 60)
    if m < 60:
        return f"{m} min {s:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def _resolve(stream: TextIO | None, enabled: bool | None) -> tuple[TextIO, bool]:
    stream = stream if stream is not None else sys.stderr
    return stream, is_terminal(stream) if enabled is None else bool(enabled)


class Progress:
    """A counted bar on ``stream`` (default: ``sys.stderr``), drawn only when it is a terminal.

    ``enabled``: None (default) draws when ``stream.isatty()``; True always (tests, forced
    output), False never. A bar with ``total <= 0`` draws nothing. ``update(n, what)`` advances by
    ``n`` and redraws when ``min_interval`` seconds have passed since the last draw or the work is
    done; reaching ``total`` closes the bar, which writes the summary line. Use it as a context
    manager to close it on errors too (the summary then says where it stopped).
    """

    def __init__(self, total: int, label: str = "working", stream: TextIO | None = None,
                 enabled: bool | None = None, width: int = 30, min_interval: float = 0.1,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.label, self.width = int(total), label, width
        self.done = 0
        self.min_interval = min_interval
        self.stream, on = _resolve(stream, enabled)
        self.enabled = on and self.total > 0
        self.closed = False
        self._clock = clock
        self._start = clock()
        self._last_draw: float | None = None
        self._shown = 0  # length of the line on screen, to blank it when a shorter one replaces it
        self.summary = ""  # the final line, once closed (also when disabled; handy for callers)

    # -- the interface of cost_models.profiled.Progress --------------------------------------

    def step(self, what: str = "") -> None:
        """One item done; ``what`` (say, the node just measured) is shown beside the bar."""
        self.update(1, what)

    # -- general ----------------------------------------------------------------------------

    @property
    def elapsed(self) -> float:
        return self._clock() - self._start

    def update(self, n: int = 1, what: str = "") -> None:
        if self.closed:
            return
        self.done = min(self.done + n, self.total) if self.total > 0 else self.done + n
        now = self._clock()
        finished = self.total > 0 and self.done >= self.total
        due = self._last_draw is None or now - self._last_draw >= self.min_interval
        if self.enabled and (finished or due):
            self._draw(self._bar(what, now))
            self._last_draw = now
        if finished:
            self.close()

    def close(self) -> None:
        """End the bar: on a terminal, replace it with ``"label: done in X s"`` and a newline."""
        if self.closed:
            return
        self.closed = True
        took = fmt_duration(self.elapsed)
        if self.total <= 0 or self.done >= self.total:
            self.summary = f"{self.label}: done in {took}"
        else:
            self.summary = f"{self.label}: stopped at {self.done}/{self.total} after {took}"
        if self.enabled:
            self._draw(self.summary)
            self._write("\n")

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- drawing ------------------------------------------------------------------------------

    def _bar(self, what: str, now: float) -> str:
        fill = self.width * self.done // self.total
        line = f"{self.label} [{'#' * fill}{'.' * (self.width - fill)}] {self.done}/{self.total}"
        spent = now - self._start
        if 0 < self.done < self.total and spent > 0:
            line += f" eta {fmt_duration(spent * (self.total - self.done) / self.done)}"
        if what:
            line += f" {what}"
        cols = shutil.get_terminal_size((100, 24)).columns - 1
        return line[:cols] if cols > 20 else line

    def _draw(self, line: str) -> None:
        pad = max(0, self._shown - len(line))
        self._write("\r" + line + " " * pad)
        self._shown = len(line)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (ValueError, OSError):  # a closed or broken stream must not fail the work
            self.enabled = False


class Phase:
    """What ``phase`` yields: ``seconds`` (set when the block ends) and ``failed``."""

    def __init__(self, label: str):
        self.label = label
        self.seconds: float | None = None
        self.failed = False
        self.summary = ""


@contextlib.contextmanager
def phase(label: str, stream: TextIO | None = None, enabled: bool | None = None,
          clock: Callable[[], float] = time.monotonic) -> Iterator[Phase]:
    """An uncounted status line for one blocking step: ``with phase("tracing GPT"): ...``.

    On a terminal it writes ``"tracing GPT ..."`` at the start and completes the same line with the
    time taken (``"tracing GPT ... 1.2 s"``) or ``"failed after 1.2 s"`` if the block raises (the
    exception propagates). Elsewhere it writes nothing.
    """
    stream, on = _resolve(stream, enabled)
    info = Phase(label)

    def write(text: str) -> None:
        nonlocal on
        if on:
            try:
                stream.write(text)
                stream.flush()
            except (ValueError, OSError):
                on = False

    write(f"{label} ...")
    start = clock()
    try:
        yield info
    except BaseException:
        info.failed = True
        raise
    finally:
        info.seconds = clock() - start
        took = fmt_duration(info.seconds)
        info.summary = f"{label} ... " + (f"failed after {took}" if info.failed else took)
        write("\r" + info.summary + "\n")
