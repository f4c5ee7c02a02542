"""autopar: automatic parallelization-strategy search for PyTorch models.

The public API is what this module exports: ``trace``, ``plan``, ``compile`` (an
``autopar.ParallelModule``), ``compile_many``, ``fuse``, ``Plan``, ``Cluster``, the errors and the
benchmark ``zoo``; each is the function itself, with its own signature and docstring. Every entry
point resolves the cluster alike (``autopar.core.resolve``: by default the local machine, the ``cpu``
preset). Everything else lives in the subpackages (docs/architecture.md):
trace -> ir.Graph -> cost tables -> search -> Plan -> codegen / report.
"""

from autopar import zoo
from autopar.core.cluster import Cluster
from autopar.core.errors import AutoparError, InfeasibleError, LaunchRequiredError, PlanMismatchError, TraceError
from autopar.compiler import compile
from autopar.fusion.fuse import fuse
from autopar.frontend.trace import trace
from autopar.parallel_module import NotPlannedYet, ParallelModule
from autopar.many import compile_many
from autopar.planning.plan import Plan
from autopar.planning.planner import plan

__version__ = "0.1.0"


def save_checkpoint(path, module, optimizer=None, *, step: int, keep: int = 2):
    """Save ``module`` and ``optimizer`` sharded, as step ``step`` under folder ``path`` (see
    ``autopar.runtime.checkpoint.save``); every rank calls it."""
    from autopar.runtime.checkpoint import save

    return save(path, module, optimizer, step=step, keep=keep)


def load_checkpoint(path, module, optimizer=None) -> int:
    """Load the newest checkpoint under ``path`` into a compiled module (any plan, any device
    count) or the plain model; returns its step (see ``autopar.runtime.checkpoint.load``)."""
    from autopar.runtime.checkpoint import load

    return load(path, module, optimizer)


__all__ = [
    "AutoparError", "Cluster", "InfeasibleError", "LaunchRequiredError", "NotPlannedYet", "ParallelModule", "Plan",
    "PlanMismatchError",
    "TraceError", "compile", "compile_many", "fuse", "load_checkpoint", "plan", "save_checkpoint", "trace",
    "zoo",
]
