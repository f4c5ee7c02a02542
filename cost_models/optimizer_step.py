"""What the optimizer's update at the end of a training step costs one device.

The update is memory-bound: its time is the bytes it moves per element
(``cost_models.training.optimizer_step_time``: torch's foreach passes over whole fp32 tensors, or
one fused kernel, as the cluster says) x the parameter elements this device updates, over the
memory bandwidth. Replicated parameters (data parallelism) are updated whole on every device, sharded
ones in part, and ZeRO >= 1 splits the update over the data-parallel devices.
"""

from __future__ import annotations

import numpy as np

from autopar.core.cluster import Cluster
from autopar.core.ir import FLOAT_DTYPES, Node
from autopar.core.layout import shard_mask
from autopar.core.strategy import node_training
from autopar.core.tables import Mesh
from autopar.cost_models.memory import optimizer_states
from autopar.cost_models.training import optimizer_step_time


# The optimizers whose update is priced (the bytes: ``training.UPDATE_PASSES``). Memory passes
# over one fp32 element per update, in torch's per-tensor implementations: AdamW's
# lerp_ (3: read moment and gradient, write the moment), mul_ + addcmul_ of the second moment
# (2 + 4), sqrt, division and add_ of the denominator (2 + 2 + 2), addcdiv_ into the parameter (4)
# and the decay's mul_ (2) = 21; Adam the same less the decay (19); plain SGD one add_ (3).
OPTIMIZER_PASSES = {"adamw": 21, "adam": 19, "sgd": 3}


def local_elements(node: Node, own: np.ndarray, mesh: Mesh, itemsize: int | None = None) -> np.ndarray:
    """Float parameter elements one device updates under each config (rows of the owner matrix
    ``own``): its shard of each parameter, further divided over the data-parallel axes (those its
    gradient is a partial sum along) under ZeRO >= 1."""
    sizes = np.asarray(mesh.shape, dtype=float)
    zero = node_training(node).zero
    out = np.zeros(len(own))
    for op in node.params:
        if op.spec.dtype not in FLOAT_DTYPES or (itemsize is not None and op.spec.itemsize != itemsize):
            continue  # buffers (masks, counters) are not updated; ``itemsize``: that dtype's only
        sh = shard_mask(node, op.spec, own)
        local = op.spec.numel / np.prod(np.where(sh, sizes, 1.0), axis=1)
        if zero >= 1:
            local = local / np.prod(np.where((own >= 0) & ~sh, sizes, 1.0), axis=1)
        out += local
    return out


def optimizer_step(optimizer: str | None, node: Node, own: np.ndarray, mesh: Mesh, cluster: Cluster,
                   memory_efficiency: float) -> np.ndarray:
    """Seconds of ``optimizer``'s update of the node's local parameters, per config (zeros for
    None, an optimizer without a figure, or a node without parameters): the elements this device
    steps (``local_elements``) priced by ``training.optimizer_step_time``, the function the
    hierarchical search prices a stage's update with, so one plan's update costs the same on
    both paths (torch's foreach passes or one fused kernel as ``Cluster.foreach_update`` says,
    the fp32 master weights of mixed precision read and the compute copy written)."""
    if not OPTIMIZER_PASSES.get((optimizer or "").lower(), 0) or not node.params:
        return np.zeros(len(own))
    out = np.zeros(len(own))
    states, master = optimizer_states(optimizer), node_training(node).master
    for itemsize in sorted({op.spec.itemsize for op in node.params if op.spec.dtype in FLOAT_DTYPES}):
        elems = local_elements(node, own, mesh, itemsize)
        out = out + optimizer_step_time(elems, itemsize, states, master, cluster.memory_bandwidth,
                                        memory_efficiency, foreach=cluster.foreach_update)
    return out
