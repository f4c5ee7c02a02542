"""Tracing never changes the user's model.

A forward runs while it is traced, so whatever it assigns to its modules (``self.calls += 1``
rebinds the buffer to a traced value under torch.fx; ``self.cache = ...``) would stay in the
user's model: a buffer holding an fx Proxy broke every later trace and call. ``unchanged``
records every module's attributes, parameters, buffers and children before a front end runs,
and puts them back on every path; ``Snapshot.assigned`` says which the forward reassigned, so
the fx front end can refuse a graph that would miss the assignment (torch.export records it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch.nn as nn

_SLOTS = ("_parameters", "_buffers", "_modules")


@dataclass
class Snapshot:
    """Every module of a model with its attributes and state as they were."""

    saved: list[tuple[str, nn.Module, dict, tuple[dict, ...]]]

    def assigned(self) -> list[str]:
        """Qualified names of the parameters, buffers and attributes the forward rebound."""
        out = []
        for prefix, m, attrs, slots in self.saved:
            now = [vars(m)] + [vars(m).get(s, {}) for s in _SLOTS]
            for before, after in zip((attrs, *slots), now):
                for name, value in after.items():
                    if name in before and before[name] is not value and name not in _SLOTS:
                        out.append(f"{prefix}{name}")
        return out

    def restore(self) -> None:
        for _, m, attrs, slots in self.saved:
            d = vars(m)
            for key in [k for k in d if k not in attrs]:
                del d[key]
            d.update(attrs)
            for s, content in zip(_SLOTS, slots):
                d[s].clear()
                d[s].update(content)


@contextlib.contextmanager
def unchanged(model: nn.Module) -> Iterator[Snapshot]:
    """Within: ``model`` may be traced; on exit, by any path, it is as it was."""
    saved = [(f"{name}." if name else "", m, dict(vars(m)), tuple(dict(vars(m).get(s, {})) for s in _SLOTS))
             for name, m in model.named_modules(remove_duplicate=False)]
    snapshot = Snapshot(saved)
    try:
        yield snapshot
    finally:
        snapshot.restore()
