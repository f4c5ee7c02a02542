"""Measured op times on disk, so a second planning run measures nothing.

One SQLite table (stdlib ``sqlite3``), keyed by device name, torch version and the op's
signature (op, local shapes, dtypes, attrs): a timing is only reused on the same device with the
same kernels. A failed measurement is stored too (``error`` set), so an op the runner cannot run
is not retried on every plan. The file is opened per call (no connection kept across threads or
forks); the in-memory dict spares repeated queries within one run.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_PATH = "~/.cache/autopar/profile.sqlite"

_SCHEMA = """CREATE TABLE IF NOT EXISTS timings (
    device TEXT NOT NULL, torch TEXT NOT NULL, signature TEXT NOT NULL,
    forward REAL, backward REAL, error TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (device, torch, signature))"""


def default_path() -> Path:
    """``$AUTOPAR_CACHE`` if set, else ``~/.cache/autopar/profile.sqlite``."""
    return Path(os.environ.get("AUTOPAR_CACHE") or DEFAULT_PATH).expanduser()


@dataclass(frozen=True)
class Timing:
    """Median seconds of one op's forward and backward (``error``: why it was not measured)."""

    forward: float | None
    backward: float | None
    error: str = ""


@dataclass
class ProfileCache:
    path: Path | str | None = None
    hits: int = 0
    misses: int = 0
    _memo: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path).expanduser() if self.path else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._sql(_SCHEMA)

    def _sql(self, query: str, args: tuple = ()) -> list[tuple]:
        db = sqlite3.connect(str(self.path), timeout=30)
        try:
            with db:  # commits on success
                return db.execute(query, args).fetchall()
        finally:
            db.close()

    def get(self, device: str, torch_version: str, signature: str) -> Timing | None:
        key = (device, torch_version, signature)
        hit = self._memo.get(key)
        if hit is None:
            rows = self._sql("SELECT forward, backward, error FROM timings WHERE device=? AND "
                             "torch=? AND signature=?", key)
            if rows:
                hit = self._memo[key] = Timing(*rows[0])
        if hit is None:
            self.misses += 1
        else:
            self.hits += 1
        return hit

    def put(self, device: str, torch_version: str, signature: str, timing: Timing) -> None:
        key = (device, torch_version, signature)
        self._memo[key] = timing
        self._sql("INSERT OR REPLACE INTO timings VALUES (?, ?, ?, ?, ?, ?)",
                  (*key, timing.forward, timing.backward, timing.error))

    def __len__(self) -> int:
        return self._sql("SELECT COUNT(*) FROM timings")[0][0]
