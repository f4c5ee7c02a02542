"""autopar: automatic parallelization-strategy search for PyTorch models.

Pipeline (one direction): trace -> ir.Graph -> cost tables -> search -> Plan -> codegen / report.
"""

from autopar import zoo
from autopar.errors import AutoparError, InfeasibleError, PlanMismatchError, TraceError
from autopar.cluster import Cluster
from autopar.ir import Dim, Edge, Graph, Node, Operand, TensorSpec
from autopar.plan import Plan

__version__ = "0.1.0"


# bound eagerly: importing the submodule autopar.trace must not shadow the function
from autopar.trace import trace  # noqa: E402

def plan(model, example_inputs, cluster=8, **kwargs) -> Plan:
    """Find the best parallelization strategy (see ``autopar.planner.plan``)."""
    from autopar.planner import plan as _plan

    return _plan(model, example_inputs, cluster, **kwargs)


__all__ = [
    "Cluster", "Plan", "plan",
    "AutoparError", "Dim", "Edge", "Graph", "InfeasibleError", "Node", "Operand",
    "PlanMismatchError", "TensorSpec", "TraceError", "trace", "zoo",
]
