"""In-place calls (``x.relu_()``, ``nn.ReLU(inplace=True)``, ``F.relu(x, inplace=True)``,
``self.running.mul_(0.9).add_(...)``, ATen's ``add_``).

The sharded module runs every node through ``local_map``, whose local inputs are views made by a
custom autograd Function: autograd forbids writing into them. So an in-place call runs out of
place on a copy of the tensor it writes into, and the runner then binds that fx argument, and
every earlier in-place result it was written through (``mul_(0.9).add_(...)`` writes twice into
one tensor), to the result, so every later reader sees the written value, as in eager mode (the
functionalization torch.export performs, done at the interpreter; gradients are those of the
functional program, which are eager's).

A write into a parameter or buffer is also copied back into its storage, in the layout the
tensor is stored in (``write_state``), so the next step reads it, as it would on one device.
The value written is the one the single device computes: a statistic of a batch-split tensor
(``x.mean(0)``) is its global value, reduced over the ranks as every other partial result, so
every rank holds the same buffer (a synchronized running statistic, as ``SyncBatchNorm`` keeps,
not DDP's per-rank ones).

Writes that rebinding cannot keep are refused in one line (``unkept``): a write into a view of
another tensor (``h[:, :4].mul_(2)``, which eager makes visible in ``h``), or into a tensor whose
view, taken before the write, is read after it.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn as nn
from torch.fx.node import has_side_effect

STATE_WRITE = "autopar_state_write"  # node.meta key: a ``write_state`` call (never recomputed)
_AUGMENTED = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
              operator.ipow, operator.imod, operator.iand, operator.ior, operator.ixor}

# calls whose result shares its first argument's storage (torch, Tensor methods, ATen packets)
VIEWS = frozenset(("view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "transpose", "permute", "t",
                   "T", "mT", "unsqueeze", "squeeze", "expand", "expand_as", "narrow", "select", "slice", "chunk",
                   "split", "split_with_sizes", "tensor_split", "unbind", "getitem", "as_strided", "diagonal",
                   "movedim", "moveaxis", "swapaxes", "swapdims", "detach", "alias", "_unsafe_view", "unfold",
                   "contiguous", "real", "imag", "view_as_real", "view_as_complex"))


def written_argument(n: fx.Node, module: nn.Module | None = None) -> fx.Node | None:
    """The fx node whose tensor the call ``n`` writes into (its first argument), or None."""
    first = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
    if first is None:
        return None
    if n.op == "call_method":
        return first if n.target.endswith("_") and not n.target.endswith("__") else None
    if n.op == "call_function":
        if isinstance(n.target, torch._ops.OpOverload):  # ATen: its schema says it writes its self
            args = n.target._schema.arguments
            writes = bool(args) and args[0].alias_info is not None and args[0].alias_info.is_write
            return first if writes else None
        name = getattr(n.target, "__name__", "")
        if n.kwargs.get("inplace") is True or n.target in _AUGMENTED:
            return first
        return first if name.endswith("_") and not name.startswith("_") else None
    if n.op == "call_module":
        return first if getattr(module, "inplace", False) is True else None
    return None


class Writes:
    """The tensors in-place calls wrote into, each group under the tensor first written (its root)."""

    def __init__(self) -> None:
        self.root: dict[fx.Node, fx.Node] = {}

    def record(self, n: fx.Node, written: fx.Node) -> list[fx.Node]:
        """Record that ``n`` wrote into ``written``; the nodes that now name the written tensor."""
        root = self.root.get(written, written)
        self.root[n] = root
        return [root] + [k for k, r in self.root.items() if r is root]

    def rewrites(self, n: fx.Node, written: fx.Node) -> bool:
        """Is ``n`` a copy into ``written`` of what was already written into it? torch.export ends
        its graph with ``copy_(buffer, add_)`` for a buffer ``add_`` updated in place: done already."""
        src = n.args[1] if len(n.args) > 1 and isinstance(n.args[1], fx.Node) else None
        return _name(n) == "copy_" and src is not None and \
            self.root.get(src, src) is self.root.get(written, written)


def _name(n: fx.Node) -> str:
    if isinstance(n.target, torch._ops.OpOverload):
        return n.target.overloadpacket.__name__
    return n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))


def _is_view(n: fx.Node) -> bool:
    return n.op in ("call_method", "call_function") and _name(n) in VIEWS


def unkept(n: fx.Node, group: list[fx.Node], order: dict[fx.Node, int]) -> str | None:
    """Why the program cannot keep the write ``n`` into the tensor ``group`` names (a clause for
    a one-line error), or None when rebinding its readers keeps it exactly."""
    root = group[0]
    if _is_view(root) and isinstance(root.args[0], fx.Node):
        return f"writes into a view of {root.args[0].name} ({root.name})"
    at = order[n]

    def read_after(view: fx.Node) -> fx.Node | None:
        for user in view.users:
            if order.get(user, -1) > at and user is not n:
                return user
            if _is_view(user) and order.get(user, at) < at:
                found = read_after(user)
                if found is not None:
                    return found
        return None

    for member in group:
        for user in member.users:
            if _is_view(user) and order.get(user, at) < at:
                reader = read_after(user)
                if reader is not None:
                    return f"writes into {root.name}, whose view {user.name} (taken before) is read after ({reader.name})"
    return None


@has_side_effect
def write_state(stored: torch.Tensor, value: torch.Tensor) -> None:
    """Copy an in-place call's result into the parameter's or buffer's local tensor (its storage),
    outside autograd, as the in-place call does on one device; never removed as dead code."""
    with torch.no_grad():
        stored.copy_(value)
