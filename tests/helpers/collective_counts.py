"""The collectives a sharded module really runs, for comparison with a plan's predicted list.

``measure(module, *inputs)`` runs one forward and one backward under DTensor's
``CommDebugMode`` and returns the counts per collective, forward and backward apart, with the op
names stripped of their namespace (``{"all_reduce": 2, "all_gather_into_tensor": 1}``).
The forward's output must be a scalar (a loss) for the backward.

CommDebugMode tracks modules with global hooks: measure on real processes (``autopar.runtime.launch``),
not on the threaded process group, where the ranks' hooks interleave.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torch.distributed.tensor.debug import CommDebugMode


@dataclass(frozen=True)
class Collectives:
    forward: dict[str, int]
    backward: dict[str, int]


# the c10d ops the fast moves (``autopar.codegen.moves``) and the gradient buckets call, under the names of the
# functional collectives DTensor's redistribute calls for the same move
C10D_NAMES = {"allreduce_": "all_reduce", "_allgather_base_": "all_gather_into_tensor",
              "_reduce_scatter_base_": "reduce_scatter_tensor", "alltoall_base_": "all_to_all_single"}


def counts(mode: CommDebugMode) -> dict[str, int]:
    """{"all_reduce": 1, ...}: non-zero counts, op names without their namespace (c10d's in-place
    ops under their functional names)."""
    out: dict[str, int] = {}
    for op, n in mode.get_comm_counts().items():
        if n:
            name = str(op).rsplit(".", 1)[-1]
            name = C10D_NAMES.get(name, name)
            out[name] = out.get(name, 0) + n
    return out


def measure(module: nn.Module, *inputs) -> Collectives:
    with CommDebugMode() as fwd:
        loss = module(*inputs)
    with CommDebugMode() as bwd:
        loss.backward()
    return Collectives(counts(fwd), counts(bwd))
