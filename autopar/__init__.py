"""autopar: automatic parallelization-strategy search for PyTorch models.

Pipeline (one direction): trace -> ir.Graph -> cost tables -> search -> Plan -> codegen / report.
"""

from autopar import zoo
from autopar.core.errors import AutoparError, InfeasibleError, LaunchRequiredError, PlanMismatchError, TraceError
from autopar.core.cluster import Cluster
from autopar.core.ir import Dim, Edge, Graph, Node, Operand, TensorSpec
from autopar.planning.plan import Plan

__version__ = "0.1.0"


# bound eagerly: importing the submodule autopar.frontend.trace must not shadow the function
from autopar.frontend.trace import trace  # noqa: E402

def plan(model, example_inputs=(), cluster=8, **kwargs) -> Plan:
    """Find the best parallelization strategy (see ``autopar.planning.planner.plan``)."""
    from autopar.planning.planner import plan as _plan

    return _plan(model, example_inputs, cluster, **kwargs)


def compile(model, devices=None, example_inputs=None, **kwargs):
    """This rank's sharded module for training ``model`` (see ``autopar.compiler.compile``)."""
    from autopar.compiler import compile as _compile

    return _compile(model, devices, example_inputs, **kwargs)


def launch(fn, nprocs, *args, **kwargs):
    """Run ``fn(rank, nprocs, *args)`` on ``nprocs`` local gloo CPU processes; results by rank."""
    from autopar.codegen.launch import launch as _launch

    return _launch(fn, nprocs, *args, **kwargs)


__all__ = [
    "Cluster", "Plan", "compile", "launch", "plan", "LaunchRequiredError",
    "AutoparError", "Dim", "Edge", "Graph", "InfeasibleError", "Node", "Operand",
    "PlanMismatchError", "TensorSpec", "TraceError", "trace", "zoo",
]
