"""autopar: automatic parallelization-strategy search for PyTorch models.

The public API is what this module exports: ``trace``, ``plan``, ``compile``, ``Plan``, ``Cluster``,
the errors and the benchmark ``zoo``. Everything else lives in the subpackages (docs/architecture.md):
trace -> ir.Graph -> cost tables -> search -> Plan -> codegen / report.
"""

from autopar import zoo
from autopar.core.cluster import Cluster
from autopar.core.errors import AutoparError, InfeasibleError, LaunchRequiredError, PlanMismatchError, TraceError
from autopar.frontend.trace import trace
from autopar.planning.plan import Plan

__version__ = "0.1.0"


def plan(model, example_inputs=(), cluster=None, **kwargs) -> Plan:
    """Find the best parallelization strategy (see ``autopar.planning.planner.plan``)."""
    from autopar.planning.planner import plan as _plan

    return _plan(model, example_inputs, cluster, **kwargs)


def compile(model, example_inputs=(), cluster=None, **kwargs):
    """This rank's sharded module for training ``model`` (see ``autopar.compiler.compile``)."""
    from autopar.compiler import compile as _compile

    return _compile(model, example_inputs, cluster, **kwargs)


def save_checkpoint(path, module, optimizer=None, *, step: int, keep: int = 2):
    """Save ``module`` and ``optimizer`` sharded, as step ``step`` under folder ``path`` (see
    ``autopar.codegen.checkpoint.save``); every rank calls it."""
    from autopar.codegen.checkpoint import save

    return save(path, module, optimizer, step=step, keep=keep)


def load_checkpoint(path, module, optimizer=None) -> int:
    """Load the newest checkpoint under ``path`` into a compiled module (any plan, any device
    count) or the plain model; returns its step (see ``autopar.codegen.checkpoint.load``)."""
    from autopar.codegen.checkpoint import load

    return load(path, module, optimizer)


def fuse(models, example_inputs, **kwargs):
    """K models of one architecture as one module (see ``autopar.fusion.fuse``)."""
    from autopar.fusion import fuse as _fuse

    return _fuse(models, example_inputs, **kwargs)


def compile_many(models, devices, example_inputs, **kwargs):
    """Plan, schedule and train many models at once (see ``autopar.many.compile_many``)."""
    from autopar.many import compile_many as _compile_many

    return _compile_many(models, devices, example_inputs, **kwargs)


__all__ = [
    "AutoparError", "Cluster", "InfeasibleError", "LaunchRequiredError", "Plan", "PlanMismatchError",
    "TraceError", "compile", "compile_many", "fuse", "load_checkpoint", "plan", "save_checkpoint", "trace",
    "zoo",
]
