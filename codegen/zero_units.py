"""ZeRO-3 per unit, as ``fully_shard`` on each block runs it: a block's parameters gathered just
before its forward and freed after it, gathered again for its backward and freed once its
gradients are in, the next unit's gather started while one runs (prefetch).

A *unit* is one entry of a repeated container (``layers.3``: ``core.blocks.block_path`` of the
parameter's name), the root holding every other parameter (embeddings, the final norm, the head):
torchtitan's recipe (``fully_shard`` on each transformer block, then on the model). The gradient
buckets of a ZeRO-3 plan hold one unit's parameters each (``core.buckets.make_buckets``), so a
unit's buckets are what is gathered and freed.

Why not ``fully_shard`` itself: it hooks a module's forward and its parameters, while the
generated program is one graph reading every parameter's local tensor as an input (and
``torch.utils.checkpoint`` re-runs a block's part of it). So the program's graph gets the hooks
instead (``gate``): a ``UnitGate`` call before the first node that reads a unit's parameters
(directly or through views and casts of them) gathers the unit and starts the next one's gather;
one after the last such node frees the unit and passes the unit's values that later nodes read
through an autograd identity whose backward, which runs before any of the unit's own backward,
gathers the unit again and starts the previous one's gather. ``GradReducer`` frees a bucket
when its reduce-scatter starts (its gradients are in: no node of the backward reads it after).
The root has no gates: it is gathered when the program starts and stays whole to the backward's
end, as ``fully_shard`` leaves the root module unsharded after its forward (its readers, an
embedding and a head, bracket the program anyway); so does a block read by the program's output.
On a pipeline stage (``step_whole``) the root stays whole to the optimizer's step: one
microbatch's backward may end while another's forward has saved the root's parameters.

So a rank holds its slices, the root, and at most two blocks' parameters whole at once: what the
cost models price (``cost_models.training.zero3_gathered``).
"""

from __future__ import annotations

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from autopar.core.blocks import block_path

from .zero import gather, release

ROOT = ""


def unit_of(name: str) -> str:
    """The unit a parameter belongs to: its block (``layers.3``), else the root."""
    return block_path(name) or ROOT


class ZeroUnits:
    """Gathers and frees the ZeRO-3 buckets of each unit (``GradReducer.shards``)."""

    def __init__(self, reducer, names: dict[int, str]):
        self.reducer = reducer
        self.buckets: dict[str, list[int]] = {}
        for b, unit in enumerate(reducer.bucket_unit):
            if b in reducer.shards and unit is not None:
                self.buckets.setdefault(unit, []).append(b)
        # the parameters these buckets hold, by name (``names``: id of a leaf -> its name)
        self.names = {names[id(leaf)] for b in reducer.shards for leaf in reducer.buckets[b] if id(leaf) in names}
        self.order: list[str] = []  # the gated units in the order the forward first reads them
        self.whole: list[str] = list(self.buckets)  # units gathered for the whole step (the root)
        # a pipeline stage's: the root stays whole over every microbatch's backward, to the step
        self.step_whole = False

    def begin(self) -> None:
        """Before the program's forward: the units no gate gathers (the root) whole."""
        for unit in self.whole:
            self.gather(unit)

    def gather(self, unit: str, wait: bool = True) -> None:
        for b in self.buckets.get(unit, ()):
            gather(self.reducer.shards[b], wait)

    def release(self, unit: str) -> None:
        for b in self.buckets.get(unit, ()):
            release(self.reducer.shards[b])

    def neighbour(self, unit: str, step: int) -> str | None:
        if unit not in self.order:
            return None
        k = self.order.index(unit) + step
        return self.order[k] if 0 <= k < len(self.order) else None

    def enter(self, unit: str) -> None:
        """Before the unit's forward: it whole, the next unit's gather started."""
        self.gather(unit)
        nxt = self.neighbour(unit, 1)
        if nxt is not None:
            self.gather(nxt, wait=False)

    def backward_enter(self, unit: str) -> None:
        """Before the unit's backward: it whole again, the previous unit's gather started."""
        self.gather(unit)
        prev = self.neighbour(unit, -1)
        if prev is not None:
            self.gather(prev, wait=False)


class _Regather(torch.autograd.Function):
    """Identity forward; its backward gathers the unit before the unit's own backward runs."""

    @staticmethod
    def forward(ctx, units, unit, *xs):
        ctx.units, ctx.unit = units, unit
        return tuple(x.view_as(x) for x in xs)

    @staticmethod
    def backward(ctx, *grads):
        ctx.units.backward_enter(ctx.unit)
        return (None, None, *grads)


class UnitGate(nn.Module):
    """The program's hook into ``ZeroUnits`` (set by ``attach``; none: does nothing)."""

    units: ZeroUnits | None = None

    def forward(self, kind: str, unit: str, *values):
        units = self.units
        if kind == "enter":
            if units is not None:
                units.enter(unit)
            return None
        if units is None:
            return values
        leaves, spec = pytree.tree_flatten(list(values))
        pos = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.requires_grad]
        if torch.is_grad_enabled() and not pos and values:
            return values  # nothing the backward passes through: the unit stays whole for it
        if pos and torch.is_grad_enabled():
            out = _Regather.apply(units, unit, *(leaves[i] for i in pos))
            for i, t in zip(pos, out):
                leaves[i] = t
        units.release(unit)
        return tuple(pytree.tree_unflatten(leaves, spec))


RECAST = "_autopar_recast"  # on a cast parameter: (the parameter, the dtype) it was cast from and to


def cast(param: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A ZeRO-3 parameter in the compute dtype (mixed precision), marked so that what the backward
    keeps of it is made again from the regathered parameter (``recast_hooks``), as ``fully_shard``
    with a ``MixedPrecisionPolicy`` gathers the low-precision parameter again for the backward.
    A parameter gathered in ``dtype`` already (``zero.store_compute``) is read as it is."""
    if param.dtype == dtype:
        return param
    out = param.to(dtype)
    setattr(out, RECAST, (param, dtype))
    return out


def _pack(t: torch.Tensor):
    mark = getattr(t, RECAST, None) or (getattr(t._base, RECAST, None) if t._base is not None else None)
    if mark is None:
        return t
    return (RECAST, mark[0], mark[1], t.size(), t.stride(), t.storage_offset())


def _unpack(saved):
    if not (isinstance(saved, tuple) and saved and saved[0] == RECAST):
        return saved
    _, param, dtype, size, stride, offset = saved
    with torch.no_grad():
        return param.detach().to(dtype).as_strided(size, stride, offset)


def recast_hooks():
    """Saved-tensor hooks under which a cast ZeRO-3 parameter (or a view of it) the backward needs
    is kept as a note and cast again from the parameter when read: its unit is whole again by then
    (``_Regather``), and otherwise each block's low-precision copy would live to the backward."""
    return torch.autograd.graph.saved_tensors_hooks(_pack, _unpack)


def attach(gm: fx.GraphModule, units: ZeroUnits) -> None:
    gate = getattr(gm, GATE, None)
    if isinstance(gate, UnitGate):
        object.__setattr__(gate, "units", units)


GATE = "zero_unit_gate"


def gate(gm: fx.GraphModule, state: list[str], units: ZeroUnits) -> list[str]:
    """Put ``UnitGate`` calls around each unit's readers in ``gm`` (once); the units in the order
    the forward first reads them."""
    nodes = list(gm.graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    placeholders = [n for n in nodes if n.op == "placeholder"]
    gated = set(units.buckets)
    owner: dict[fx.Node, str] = {}  # placeholders of the units' parameters, and values made from them alone
    for ph, name in zip(placeholders, state):
        if unit_of(name) in gated and name in units.names:
            owner[ph] = unit_of(name)
    span: dict[str, list[int]] = {}
    for n in nodes:
        if n.op == "placeholder":
            continue
        inputs = n.all_input_nodes
        mine = {owner[x] for x in inputs if x in owner}
        for u in mine:
            s = span.setdefault(u, [pos[n], pos[n]])
            s[1] = pos[n]
        if len(mine) == 1 and all(x in owner or x.op == "get_attr" for x in inputs) and n.op != "output":
            owner[n] = next(iter(mine))  # a view or cast of the parameters: they live as long as it
    order = sorted(span, key=lambda u: span[u][0])
    if getattr(gm, GATE, None) is None:
        gm.add_module(GATE, UnitGate())
    output = nodes[-1]
    order = [u for u in order if u != ROOT and nodes[span[u][1]] is not output]
    for u in order:
        first, last = nodes[span[u][0]], nodes[span[u][1]]
        with gm.graph.inserting_before(first):
            gm.graph.call_module(GATE, ("enter", u))
        outs = [n for n in nodes[span[u][0]:span[u][1] + 1]
                if any(pos.get(user, -1) > span[u][1] for user in n.users)]
        with gm.graph.inserting_after(last):
            exit_ = gm.graph.call_module(GATE, ("exit", u, *outs))
        at = exit_
        for k, n in enumerate(outs):
            with gm.graph.inserting_after(at):
                at = gm.graph.call_function(_item, (exit_, k))
            for user in [user for user in n.users if user in pos and pos[user] > span[u][1]]:
                user.replace_input_with(n, at)
    gm.recompile()
    return order


def _item(values, k):
    return values[k]


def instrument(gm: fx.GraphModule, state: list[str], units: ZeroUnits) -> None:
    """Gate ``gm`` (a program's module) once and hook it to ``units``."""
    if getattr(gm, GATE, None) is None:
        order = gate(gm, state, units)
        if not units.order:
            units.order = order
            units.whole = [u for u in units.buckets if u not in order]
            if units.step_whole:  # freed by the optimizer's step (``zero.ShardedOptimizer``), not a backward
                units.reducer.kept = {b for u in units.whole for b in units.buckets[u]}
    attach(gm, units)
