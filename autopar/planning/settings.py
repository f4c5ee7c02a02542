"""The planner's options, in three groups: how to search, how the model trains, which space.

``autopar.plan`` keeps one explicit keyword per option (what a user reads in its signature); the
planner groups them here once, checks them once, and hands the groups down, so that a function
of the planner takes the group it reads rather than a dozen loose arguments, and a new option
(a parallelism, a training feature) is one field in one group.
"""

from __future__ import annotations

from dataclasses import dataclass

SWITCH = (True, False, "auto")


@dataclass(frozen=True)
class SearchSettings:
    """How to search: the search (``planning/registry.py``), the solver's limit in seconds,
    whether to try pipeline stages, plan by degrees per cluster level (``hierarchical``), search
    the space where view-like ops follow their producers (``follow``), price the baselines, and
    keep every term's arithmetic (``explain``)."""

    search: str = "auto"
    time_limit: float = 60.0
    pipeline: bool | str = "auto"
    hierarchical: bool | str = "auto"
    follow: bool | str = "auto"
    baselines: bool = True
    explain: bool = False

    def __post_init__(self):
        if self.pipeline not in SWITCH:
            raise ValueError(f"pipeline must be True, False or 'auto', not {self.pipeline!r}")
        if self.follow not in SWITCH:
            raise ValueError(f"follow must be True, False or 'auto', not {self.follow!r}")
        if not (self.time_limit > 0):
            raise ValueError("time_limit is the solver's limit in seconds and must be > 0, "
                             f"not {self.time_limit!r}")


@dataclass(frozen=True)
class TrainingSettings:
    """How the model runs: ``mode`` ("train" or inference), its optimizer, and the training
    options the search may choose among (``precision``, ``zero`` 0-3 or "auto", ``recompute``
    bool or "auto"; ``planning/options.py``, ``core/strategy.py``)."""

    mode: str = "train"
    optimizer: str | None = "adam"
    precision: str | None = None
    zero: int | str = "auto"
    recompute: bool | str = "auto"
    accumulate: int | str = "auto"  # gradient accumulation on the flat path (planning/accumulation.py)

    @property
    def choices(self) -> tuple:
        """(precision, zero, recompute): what ``planning.options.option_sets`` expands."""
        return self.precision, self.zero, self.recompute


@dataclass(frozen=True)
class SpaceSettings:
    """Which space is searched: ``space`` ("mesh", "pase", "pase:N"), a pinned degree per
    parallelism (``pin``: "tensor=8,pipeline=64,data=6"), and PaSE's fold rules and rates."""

    space: str = "mesh"
    pin: object = None
    pase_profile: str | None = None
    pase_rate: tuple[float, float] = (10.0, 16.0)
