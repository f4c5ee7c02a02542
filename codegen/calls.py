"""The modules a rank's program calls: one IR node on local shards that needs a repair
(``ops.LocalCall``; the others are inlined into the graph), or a batch norm with global
statistics. Each shows in ``module.code`` as ``self.<node>(...)`` and in ``print(module.program)``
with what it runs."""

from __future__ import annotations

import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from autopar.core.ir import Node

from .ops import LocalCall
from .placements import NodeLayout


class NodeCall(nn.Module):
    """One IR node on local shards (``module.code`` shows ``self.<node>(...)``)."""

    def __init__(self, call: LocalCall, label: str):
        super().__init__()
        self.call = call
        self.label = label

    def forward(self, *tensors):
        return self.call.rebuild(self.call(*tensors))

    def extra_repr(self) -> str:
        return self.label


class SyncBatchNorm(nn.Module):
    """A training batch norm with its batch split: global statistics (``batchnorm.py``)."""

    def __init__(self, owner: list, node: Node, layout: NodeLayout, mesh: DeviceMesh):
        super().__init__()
        self._owner = owner  # [the compiled module's batch-norm child], not registered twice
        self.node, self.layout, self.mesh = node, layout, mesh

    def forward(self, x):
        from torch.distributed.tensor import DTensor

        from .batchnorm import sync_batch_norm

        xp = self.layout.inputs[0]
        y = sync_batch_norm(self._owner[0], DTensor.from_local(x, self.mesh, xp, run_check=False),
                            self.node, self.layout, self.mesh)
        return y.to_local()


class SyncBatchNormOp(nn.Module):
    """An exported training batch norm with its batch split (``batchnorm.sync_batch_norm_local``)."""

    def __init__(self, node: Node, layout: NodeLayout, mesh: DeviceMesh, momentum: float, eps: float):
        super().__init__()
        self.node, self.layout, self.mesh, self.momentum, self.eps = node, layout, mesh, momentum, eps

    def forward(self, x, weight=None, bias=None, running_mean=None, running_var=None):
        from .batchnorm import sync_batch_norm_local

        return sync_batch_norm_local(x, weight, bias, running_mean, running_var, self.momentum, self.eps,
                                     self.node, self.layout, self.mesh)

    def extra_repr(self) -> str:
        return f"batch norm with global statistics, momentum {self.momentum}, eps {self.eps}"


