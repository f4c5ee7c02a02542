"""A mean cross-entropy's count of counted targets, summed over the ranks while the forward runs.

Where the items a cross-entropy averages are split, each shard's call averages over its own
counted targets (those not ``ignore_index``, weighted by their class weights where the call has
them), and those counts differ whenever the ignored targets fall unevenly (a causal LM's shifted
labels end in an ignored position, which a sequence split puts on the last shard alone; padding
falls anywhere). The loss is exact when each shard's mean is scaled by its count over the whole
batch's count, so the shards' counts are summed: one all-reduce of one float64 (exact past
float32's 2**24 targets), priced in ``cost_models/loss_count.py``.

The count depends on the targets alone, which usually are a program input, so the program does
not run it at the loss (a blocking collective there that data parallelism without it never
pays): a ``CountStart`` node counts the local targets and starts the all-reduce asynchronously
right after the targets exist (``hoist_counts`` moves it, and the pure nodes that make the
targets, as early as their inputs allow), and ``counted_scale`` waits for it at the loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn
from torch.distributed.tensor import DTensor, Partial, Replicate

from .inplace import IN_PLACE, STATE_WRITE
from .placements import LayoutError
from .training import BLOCK
from .values import free_name

COUNT = "autopar_count"  # node.meta key: a CountStart node, hoisted by ``hoist_counts``


@dataclass
class PendingCount:
    """This rank's count and the whole batch's, the latter in flight until ``wait``."""

    mine: torch.Tensor
    total: torch.Tensor
    work: Any = None  # the all-reduce's handle; None once waited for (or where it ran blocking)

    def wait(self) -> torch.Tensor:
        if self.work is not None:
            self.work.wait()
            self.work = None
        return self.total


@dataclass(frozen=True)
class CountedMean:
    """What the count of one loss needs: its ``ignore_index`` and the mesh axes that cut the
    items it averages (the all-reduce's group)."""

    ignore: int
    axes: tuple[int, ...]
    mesh: Any  # DeviceMesh

    def start(self, target: torch.Tensor, weight: torch.Tensor | None = None) -> PendingCount:
        keep = target != self.ignore
        mine = (weight[target.masked_fill(~keep, 0)] * keep).sum() if weight is not None else keep.sum()
        mine = mine.detach().to(torch.float64)
        names = self.mesh.mesh_dim_names
        if len(self.axes) > 1 and names is None:  # no flattened group to sum over at once: DTensor's, blocking
            partial = tuple(Partial() if a in self.axes else Replicate() for a in range(self.mesh.ndim))
            whole = (Replicate(),) * self.mesh.ndim
            total = DTensor.from_local(mine, self.mesh, partial, run_check=False).redistribute(self.mesh, whole)
            return PendingCount(mine, total.to_local())
        from .moves import axes_group

        total = mine.clone()
        return PendingCount(mine, total, dist.all_reduce(total, group=axes_group(self.mesh, self.axes),
                                                         async_op=True))


class CountStart(nn.Module):
    """Counts this rank's targets and starts their all-reduce (``module.code``: ``self.<loss>_count``)."""

    def __init__(self, counted: CountedMean):
        super().__init__()
        self.counted = counted

    def forward(self, target, weight=None) -> PendingCount:
        return self.counted.start(target, weight)

    def extra_repr(self) -> str:
        return f"count of targets not {self.counted.ignore}, all-reduced over mesh axes {self.counted.axes}"


def counted_scale(out: torch.Tensor, pending: PendingCount) -> torch.Tensor:
    """The local mean ``out`` weighted by this rank's share of the whole batch's count (a shard
    none of whose items count adds 0, not its mean's NaN)."""
    total = pending.wait()
    mine = pending.mine
    return torch.where(mine > 0, out, torch.zeros_like(out)) * (mine / total).to(out.dtype)


def count_operands(call, args: list, names: list[str]) -> tuple[Any, Any]:
    """The program nodes of a cross-entropy call's target and class weight (None without one):
    ``input, target, weight`` by position or keyword (a ``CrossEntropyLoss`` module's weight is
    its buffer). ``args``: the call's tensor nodes in ``call.slots`` order, then the module's
    parameters and buffers by ``names``."""
    from torch.utils import _pytree as pytree

    at = dict(zip(call.slots, args))
    pos, kw = pytree.tree_unflatten(list(range(len(call.flat))), call.spec)

    def node_of(i: int, key: str):
        k = pos[i] if len(pos) > i else kw.get(key)
        return at.get(k) if isinstance(k, int) else None

    weight = node_of(2, "weight")
    if weight is None and "weight" in names:
        weight = args[len(call.slots) + names.index("weight")]
    return node_of(1, "target"), weight


def add_count(graph: fx.Graph, root: nn.Module, name: str, counted: CountedMean, target, weight,
              out: fx.Node) -> fx.Node:
    """The loss ``out`` scaled by its count: a ``CountStart`` on ``target`` (hoisted later by
    ``hoist_counts``) and the ``counted_scale`` that waits for it."""
    if target is None:
        raise LayoutError(f"{out.name}: a mean cross-entropy over split items whose target operand is no tensor "
                          "of the call; pass the targets as its second argument or `target=`")
    name = free_name(root, name)
    root.add_module(name, CountStart(counted))
    start = graph.call_module(name, (target,) if weight is None else (target, weight))
    start.meta[COUNT] = True
    return graph.call_function(counted_scale, (out, start))


def hoist_counts(graph: fx.Graph) -> None:
    """Move every ``CountStart`` node, and the pure nodes it reads from, right after their last
    input: the all-reduce starts as soon as the targets exist. A node never moves above a write
    (an in-place call, a state write, an impure node), and a moved node lands after a recomputed
    block rather than inside it."""
    for node in [n for n in graph.nodes if n.meta.get(COUNT)]:
        node.meta.pop(BLOCK, None)  # never recomputed: its all-reduce would run again in the backward
        _hoist(node)


def _movable(n: fx.Node) -> bool:
    return n.op in ("call_function", "call_method", "call_module") and not _writes(n) and BLOCK not in n.meta


def _placeholder(n: fx.Node) -> bool:
    return n.op == "placeholder"


def _writes(n: fx.Node) -> bool:
    return bool(n.meta.get(IN_PLACE) or n.meta.get(STATE_WRITE)) or n.is_impure()


def _hoist(node: fx.Node) -> None:
    for a in node.all_input_nodes:
        if _movable(a):
            _hoist(a)
    inputs, first = set(node.all_input_nodes), node.graph._root
    at = node.prev
    while at is not first and at not in inputs and not _placeholder(at) and not _writes(at):
        at = at.prev
    if at is first:
        return
    while BLOCK in at.meta and at.next.meta.get(BLOCK) == at.meta[BLOCK]:
        at = at.next  # to the end of the block's run
    if at is not node.prev and at is not node:
        at.append(node)
