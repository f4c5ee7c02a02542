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

A write that reaches other tensors through shared storage (``aliasing``: into a view of another
tensor, ``h[:, :4].mul_(2)``, which eager makes visible in ``h``; or into a tensor whose view,
taken before the write, is read after it) cannot be kept by rebinding. Where every view linking
them is a true view in the program too (the traced view op on the same local tensor, no
collective between) and the op runs inline, it runs in place as in eager mode; otherwise it is
refused in one line.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn as nn
from torch.fx.node import has_side_effect

from .placements import LayoutError
from .values import describe

STATE_WRITE = "autopar_state_write"  # node.meta key: a ``write_state`` call (never recomputed)
IN_PLACE = "autopar_in_place"  # node.meta key: a call run in place (through views): never dead code
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

    def group(self, n: fx.Node, written: fx.Node) -> list[fx.Node]:
        """The nodes naming the tensor ``written`` (its root first), ``n`` among them."""
        root = self.root.get(written, written)
        return [root] + [k for k, r in self.root.items() if r is root and k is not n] + [n]

    def record(self, n: fx.Node, written: fx.Node) -> list[fx.Node]:
        """Record that ``n`` wrote into ``written``; the nodes that now name the written tensor."""
        self.root[n] = self.root.get(written, written)
        return self.group(n, written)

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


@dataclass
class Aliasing:
    """A write whose effect reaches tensors by sharing storage: into a view of another tensor,
    or into a tensor whose view (taken before the write) is read after it. ``views``: the view
    nodes linking them, each of which must be a true view in the program for the write to reach
    them; ``why``: the clause for a one-line refusal."""

    why: str
    views: list[fx.Node]


def aliasing(n: fx.Node, group: list[fx.Node], order: dict[fx.Node, int]) -> Aliasing | None:
    """How the write ``n`` into the tensor ``group`` names reaches other tensors through shared
    storage, or None when rebinding its readers keeps it exactly."""
    root = group[0]
    if _is_view(root) and isinstance(root.args[0], fx.Node):
        views, base = [], root
        while _is_view(base) and isinstance(base.args[0], fx.Node):
            views.append(base)
            base = base.args[0]
        return Aliasing(f"writes into a view of '{base.name}' ('{root.name}')", views)
    at = order[n]

    def read_after(view: fx.Node, chain: list[fx.Node]) -> list[fx.Node] | None:
        for user in view.users:
            if order.get(user, -1) > at and user is not n:
                return chain
            if _is_view(user) and order.get(user, at) < at:
                found = read_after(user, chain + [user])
                if found is not None:
                    return found
        return None

    for member in group:
        for user in member.users:
            if _is_view(user) and order.get(user, at) < at:
                chain = read_after(user, [user])
                if chain is not None:
                    return Aliasing(f"writes into '{root.name}', whose view '{user.name}' (taken before) is read "
                                    "after it", chain)
    return None


def true_views(views: list[fx.Node], program_node) -> bool:
    """Is each of ``views`` a view in the program too: the traced op on its base's local tensor
    (``program_node``: a traced node -> the program node holding its value, or None)?"""
    for v in views:
        new, base = program_node(v), program_node(v.args[0])
        if not (isinstance(new, fx.Node) and new.op in ("call_function", "call_method") and base is not None
                and new.args[:1] == (base,)):
            return False
    return True


def through_storage(n: fx.Node, written: fx.Node, writes: Writes, order: dict[fx.Node, int], program_node,
                    first) -> bool:
    """Must the write ``n`` run in place? True when it reaches other tensors through views that are
    true views in the program and ``first`` (its operand in the program) is the written tensor's
    node; False when rebinding its readers keeps it; a one-line ``LayoutError`` when neither."""
    shared = aliasing(n, writes.group(n, written), order)
    if shared is None:
        return False
    if first is not None and first is program_node(written) and true_views(shared.views, program_node):
        return True
    raise LayoutError(refusal(n, shared))


def refusal(n: fx.Node, shared: Aliasing, more: str = "") -> str:
    return (f"{n.name}: the in-place {describe(n)} {shared.why}{more}, which autopar cannot keep under this "
            "plan: write it out of place (y = x.add(...) for x.add_(...))")


@has_side_effect
def write_state(stored: torch.Tensor, value: torch.Tensor) -> None:
    """Copy an in-place call's result into the parameter's or buffer's local tensor (its storage),
    outside autograd, as the in-place call does on one device; never removed as dead code."""
    with torch.no_grad():
        stored.copy_(value)
