"""Searches: read CostTables, return a Solution. No search imports a cost model.

``dp`` (exact, the default), ``ilp`` (HiGHS through OR-tools, with a time limit and a gap) and
``brute`` (the reference for tests) share one contract: the optimum of the tables' objective under
the memory capacity, or ``autopar.core.errors.InfeasibleError`` when nothing fits. OR-tools is loaded
on the first ``ilp`` call, so importing this package stays cheap.
"""

from .brute import brute
from .common import SearchTooLargeError
from .dp import dp, dp_plan
from .ilp import ilp

__all__ = ["SearchTooLargeError", "brute", "dp", "dp_plan", "ilp"]
