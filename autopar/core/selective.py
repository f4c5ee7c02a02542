"""What pointwise recomputation keeps: the node kinds whose outputs op-level selective
checkpointing saves inside a recomputed block (``core.strategy.RECOMPUTE_POINTWISE``).

Inside each repeated block the matmuls (linear, matmul, einsum, convolutions) and the fused
attention kernels keep their outputs (the kernel also its log-sum-exp); every other node -- the
norms, activations, rotary products, residual adds, casts -- keeps nothing and runs again in the
backward, as does everything a kept op reads (torch re-runs the block's forward, handing back the
cached outputs of the kept ops). The block's inputs are kept, as under full recomputation. These
are the ops whose forward costs FLOPs; the others are memory-bound, so their second run costs a
few percent of a step while their outputs are most of a block's saved bytes (an eager SwiGLU and
two eager RMSNorms keep more than the linears do). ``codegen/selective.py`` names the same ops at
the aten level for torch's policy.
"""

from __future__ import annotations

from autopar.core.ir import Graph, Node

KEPT_OPS = frozenset({"linear", "matmul", "einsum", "bmm", "baddbmm", "conv1d", "conv2d", "conv3d", "sdpa"})


def keeps_output(node: Node) -> bool:
    """Whether pointwise recomputation keeps the node's outputs (and does not re-run it)."""
    return node.op in KEPT_OPS


def rerun_flops(graph: Graph, members) -> float:
    """FLOPs pointwise recomputation runs again: the forward of the nodes at ``members`` (the
    repeated blocks' nodes) that keep nothing."""
    return float(sum(graph.nodes[i].flops for i in members if not keeps_output(graph.nodes[i])))
