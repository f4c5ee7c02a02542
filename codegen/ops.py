"""The per-device body of one node: the traced call, run on local shards.

Most ops need nothing but their local shards: a linear on a column shard of its weight, an
elementwise op on a row shard, attention on a slice of the heads. ``LocalCall`` replays the fx
call on them, with parameters of a called module swapped in by ``functional_call``, and does the
generic repairs every op may need:

* shape arguments (``view``, ``reshape``, ``expand``, ``split``, ``unflatten``) were computed from
  global shapes while tracing (and from a DTensor's global ``.shape`` at run time); the local call
  needs the local sizes, which the IR's output spec divided by the splits gives;
* additive terms of a contraction are added by one device only (``placements``), minor-dim cuts
  take or place blocks, and output dims that index no input are cut down (``strided``).

What only particular ops need (averaging losses, causal masks, vocabulary shards) is in
``op_fixes``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch.func import functional_call
from torch.utils import _pytree as pytree

from autopar.core.ir import Node, TensorSpec

from .op_fixes import call_name, causal_mask, dropout_slice, own_rows
from .placements import LayoutError, NodeLayout, local_shape
from .strided import local_extent, place_blocks, take_blocks

_TENSOR = object()  # marks where an output tensor goes back
SHAPE_METHODS = {"view", "reshape", "expand", "_unsafe_view"}


@dataclass
class LocalCall:
    """One fx call with its tensor leaves taken out: ``__call__(*local_tensors)`` runs it locally.

    ``args``/``kwargs`` keep every non-tensor leaf; ``slots`` are the flat leaf positions the
    tensors go back into (in the order of ``__call__``'s arguments); ``param_names`` are the
    module parameters (after the data tensors) handed to ``functional_call``.
    """

    fx_node: fx.Node
    node: Node
    layout: NodeLayout
    module: nn.Module | None
    flat: list[Any]
    spec: Any
    slots: list[int]
    param_names: list[str]
    mean_scale: float = 1.0
    drop: set[int] = field(default_factory=set)  # tensors this device adds as zero (additive)
    vocab: tuple[int, int, int | None] | None = None  # (first row, rows, padding row) of this embedding shard
    causal_rows: tuple[int, int] | None = None  # (first query row, rows) of a split causal sdpa
    strided_in: list[tuple[TensorSpec, tuple]] = field(default_factory=list)  # per tensor arg
    index: Callable[[str], int] | None = None  # this device's chunk of a dim (strided cuts)
    out_flat: list[Any] | None = None  # the last call's output leaves (tensors as _TENSOR)
    out_spec: Any = None
    writes_first: bool = False  # an in-place call: it writes into its first tensor (``inplace``)
    whole_dropout: float | None = None  # p of a dropout run with the whole tensor's mask (op_fixes)
    groups: int | None = None  # a grouped conv whose groups are split: how many this device runs
    balance: Any = None  # a causal sdpa's query rows exchanged for balanced work (causal_balance.Balance)
    _fast: _Fast | None = field(default=None, init=False, repr=False, compare=False)

    def _prepare(self) -> _Fast:
        """What every call of this node needs or may skip, found once (at the first call, once the
        builder has set every field): the runtime's per-node Python cost is paid at every step."""
        kwargs_keys = None
        args_spec, kwargs_spec = self.spec.children()
        if (self.spec.type is tuple and args_spec.type is tuple and issubclass(kwargs_spec.type, dict)
                and all(c.is_leaf() for c in (*args_spec.children(), *kwargs_spec.children()))):
            kwargs_keys = (args_spec.num_children, tuple(kwargs_spec.context))  # flat args and kwargs
        counts = self.layout.split_counts
        name = call_name(self.fx_node)
        shapes = any(c > 1 for c in counts.values()) and (
            name in SHAPE_METHODS or name in ("split", "unflatten")
            or (name == "reshape" and self.fx_node.op == "call_function"))
        extent = tuple(any(counts.get(d, 1) > 1 for dims in spec.axes for d in dims) for spec in self.node.outputs)
        self._fast = _Fast(kwargs_keys, shapes, extent, any(self.layout.output_strided))
        return self._fast

    def _arguments(self, tensors) -> tuple[tuple, dict]:
        fast = self._fast or self._prepare()
        leaves = list(self.flat)
        for slot, t in zip(self.slots, tensors):
            leaves[slot] = t
        if fast.flat_call is not None:
            n, keys = fast.flat_call
            args, kwargs = tuple(leaves[:n]), dict(zip(keys, leaves[n:]))
        else:
            args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        if fast.shapes:
            args, kwargs = localize_shape_args(self.fx_node, self.node, self.layout, args, kwargs)
        return args, kwargs

    def __call__(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Run locally; return the tensor leaves of the output, as ``local_map`` wants them."""
        if self.drop:
            tensors = tuple(t * 0 if j in self.drop else t for j, t in enumerate(tensors))
        if self.writes_first and tensors and self.slots[:1] == [0]:
            tensors = (tensors[0].clone(), *tensors[1:])  # local_map's inputs may not be written
        if self.strided_in:
            tensors = tuple(take_blocks(t, spec, cuts, self.node, self.layout.split_counts, self.index)
                            if cuts else t for t, (spec, cuts) in zip(tensors, self.strided_in))
        args, kwargs = self._arguments(tensors)
        fast = self._fast
        if self.groups is not None and self.fx_node.op != "call_module":
            args, kwargs = local_groups(self.fx_node, args, kwargs, self.groups)
        if self.causal_rows is not None and self.balance is None:
            args, kwargs = causal_mask(self.fx_node, args, kwargs, *self.causal_rows)
        outside = None
        self._pad = None
        if self.vocab is not None:
            args, kwargs, outside, self._pad = own_rows(self.fx_node, args, kwargs, *self.vocab)
        if self.whole_dropout is not None:
            out = dropout_slice(tensors[0], self.node, self.layout, self.index, self.whole_dropout)
        elif self.balance is not None:
            out = self.balance.call(lambda **kw: self._invoke((), kw, tensors[len(self.slots):]), args, kwargs)
        else:
            out = self._invoke(args, kwargs, tensors[len(self.slots):])
        if outside is not None:
            out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        if self.mean_scale == 0.0:  # a mean over none of the batch (this rank's rows are none): 0, not NaN
            out = pytree.tree_map(lambda t: t.nan_to_num() * 0.0 if _is_float(t) else t, out)
        elif self.mean_scale != 1.0:
            out = pytree.tree_map(lambda t: t * self.mean_scale if _is_float(t) else t, out)
        if isinstance(out, torch.Tensor):  # the common case: one tensor, no structure around it
            flat, self.out_spec = [out], None
        else:
            flat, self.out_spec = pytree.tree_flatten(out)
        tensors_out = tuple(t for t in flat if isinstance(t, torch.Tensor))
        if len(tensors_out) != len(self.node.outputs):
            raise LayoutError(f"node {self.node.name}: the call returned {len(tensors_out)} "
                              f"tensors, the IR lists {len(self.node.outputs)} outputs")
        counts = self.layout.split_counts
        tensors_out = tuple(local_extent(t, spec, self.node, counts, self.index, self.layout.uneven) if cut else t
                            for t, spec, cut in zip(tensors_out, self.node.outputs, fast.extent))
        if fast.place:
            tensors_out = tuple(
                place_blocks(t, spec, cuts, self.node, counts, self.index) if cuts else t
                for t, spec, cuts in zip(tensors_out, self.node.outputs, self.layout.output_strided))
        self.out_flat = None if self.out_spec is None else [
            _TENSOR if isinstance(t, torch.Tensor) else t for t in flat]
        return tensors_out

    def rebuild(self, tensors_out) -> Any:
        """Put the (now distributed) output tensors back into the call's output structure."""
        if self.out_spec is None:
            return tensors_out[0]
        it = iter(tensors_out)
        leaves = [next(it) if v is _TENSOR else v for v in self.out_flat]
        return pytree.tree_unflatten(leaves, self.out_spec)

    def _invoke(self, args, kwargs, params):
        n = self.fx_node
        if n.op == "call_module":
            state = dict(zip(self.param_names, params))
            if self.groups is not None and type(self.module) in (nn.Conv1d, nn.Conv2d, nn.Conv3d):
                m = self.module
                ndim = m.weight.dim() - 2
                conv = (torch.nn.functional.conv1d, torch.nn.functional.conv2d, torch.nn.functional.conv3d)[ndim - 1]
                x = args[0]
                if m.padding_mode != "zeros":
                    x = torch.nn.functional.pad(x, m._reversed_padding_repeated_twice, mode=m.padding_mode)
                    return conv(x, state["weight"], state.get("bias"), m.stride, 0, m.dilation, self.groups)
                return conv(x, state["weight"], state.get("bias"), m.stride, m.padding, m.dilation, self.groups)
            if self.vocab is not None and type(self.module) is nn.Embedding:  # its padding row, on this shard
                m = self.module
                return torch.nn.functional.embedding(args[0], state["weight"], self._pad, m.max_norm, m.norm_type,
                                                     m.scale_grad_by_freq, m.sparse)
            out = direct_call(self.module, state, args, kwargs)
            if out is not NotImplemented:
                return out
            return functional_call(self.module, state, args, kwargs)
        if n.op == "call_method":
            self_obj, *rest = args
            return getattr(self_obj, n.target)(*rest, **kwargs)
        return n.target(*args, **kwargs)


@dataclass(frozen=True)
class _Fast:
    """A ``LocalCall``'s per-call decisions that depend only on its node and layout."""

    flat_call: tuple[int, tuple[str, ...]] | None  # (positional count, keyword names): no nesting
    shapes: bool  # a shape-taking call on a split node: ``localize_shape_args`` has work
    extent: tuple[bool, ...]  # per output: some axis is cut (``local_extent`` may have work)
    place: bool  # some output has minor-dim cuts (``place_blocks``)


def direct_call(module: nn.Module, state: dict, args, kwargs):
    """The common leaf modules as their functional forms on the local shards: the same op as
    ``functional_call`` runs, without swapping the module's tensors at every call (tens of
    microseconds per node, the runtime's largest per-op overhead). NotImplemented otherwise."""
    if kwargs or len(args) != 1:
        return NotImplemented
    x = args[0]
    if not state:
        return module(x)  # parameterless (activations, dropout, pooling): nothing to swap
    if type(module) in (nn.Conv1d, nn.Conv2d, nn.Conv3d):
        return module._conv_forward(x, state["weight"], state.get("bias"))
    functional = functional_form(module, state, x)
    return NotImplemented if functional is None else functional[0](*functional[1])


def local_groups(n: fx.Node, args, kwargs, groups: int):
    """A convolution call with this device's number of groups (``aten.convolution``'s 9th
    argument, ``F.convNd``'s and ``aten.convNd``'s 7th)."""
    aten = isinstance(n.target, torch._ops.OpOverload)
    pos = 8 if aten and n.target.overloadpacket.__name__ in ("convolution", "_convolution") else 6
    if len(args) > pos:
        args = (*args[:pos], groups, *args[pos + 1:])
    else:
        kwargs = {**kwargs, "groups": groups}
    return args, kwargs


def _is_float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def localize_shape_args(n: fx.Node, node: Node, layout: NodeLayout, args, kwargs):
    """Replace global sizes in shape-taking calls by this device's sizes (from the IR)."""
    name = call_name(n)
    counts = layout.split_counts
    if all(c == 1 for c in counts.values()):
        return args, kwargs
    if name in SHAPE_METHODS or (name == "reshape" and n.op == "call_function"):
        shape = local_shape(node.outputs[0], counts, layout.uneven)
        if "shape" in kwargs or "size" in kwargs:
            key = "shape" if "shape" in kwargs else "size"
            return args, {**kwargs, key: shape}
        if n.op == "call_method":
            return (args[0], *shape), kwargs
        return (args[0], shape, *args[2:]), kwargs
    if name == "split":
        return _localize_split(n, node, counts, args, kwargs, layout.uneven)
    if name == "unflatten":
        dim = _arg(n, args, kwargs, 1, "dim")
        sizes = _arg(n, args, kwargs, 2, "sizes")
        out = local_shape(node.outputs[0], counts, layout.uneven)
        dim = dim % (len(out) - len(sizes) + 1)
        return (args[0], dim, tuple(out[dim:dim + len(sizes)])), {}
    return args, kwargs


def _localize_split(n, node, counts, args, kwargs, uneven=None):
    dim = _arg(n, args, kwargs, 2, "dim", default=0)
    outs = [local_shape(spec, counts, uneven) for spec in node.outputs]
    dim = dim % len(outs[0])
    sizes = [o[dim] for o in outs]
    size_arg = _arg(n, args, kwargs, 1, "split_size_or_sections" if n.op == "call_function"
                    else "split_size")
    new = sizes[0] if isinstance(size_arg, int) and len(set(sizes)) == 1 else sizes
    return (args[0], new, dim), {}


def _arg(n: fx.Node, args, kwargs, i: int, key: str, default: Any = None):
    if len(args) > i:
        return args[i]
    return kwargs.get(key, default)


def inline_call(graph: fx.Graph, call: LocalCall, uses: list, args: list) -> fx.Node | None:
    """``call`` as one node of the program's graph, the traced op itself on the local shards,
    where it needs none of ``LocalCall``'s repairs: the per-node Python of a ``NodeCall`` (module
    call, argument assembly, output checks: tens of microseconds a node, ~2 ms a forward of the
    zoo gpt) is then not paid at every step. ``args``: the graph nodes of the call's tensors (data
    operands in ``call.slots`` order, then the module's parameters), ``uses`` how each is read.
    None where a repair is needed (the ``NodeCall`` runs it). An in-place call (``writes_first``)
    writes into a copy of its first operand made in the graph, as ``LocalCall`` does."""
    if call.writes_first and call.slots[:1] != [0]:
        return None
    if (call.drop or call.groups is not None or call.causal_rows is not None
            or call.vocab is not None or call.whole_dropout is not None or call.mean_scale != 1.0
            or call.balance is not None
            or any(u.strided for u in uses)
            or any(isinstance(c, torch.Tensor) for i, c in enumerate(call.flat) if i not in call.slots)):
        return None  # a tensor constant would need a buffer of the program: the NodeCall holds it
    fast = call._fast or call._prepare()
    if fast.place or not _outputs_come_cut(call, uses):
        return None
    n = call.fx_node
    operands, params = args[:len(call.slots)], args[len(call.slots):]
    call_args, call_kwargs = call._arguments(operands)  # shape arguments localized, as at run time
    if n.op in ("call_function", "call_method"):  # named as traced: ``module.code`` reads like the model
        if call.writes_first:
            call_args = (graph.call_method("clone", (call_args[0],)), *call_args[1:])
        return graph.create_node(n.op, n.target, tuple(call_args), call_kwargs, name=n.name)
    if n.op == "call_module" and not call_kwargs and len(call_args) == 1:
        state = dict(zip(call.param_names, params))
        functional = functional_form(call.module, state, call_args[0])
        if functional is not None:
            return graph.create_node("call_function", functional[0], functional[1], {}, name=n.name)
    return None


def functional_form(module: nn.Module, state: dict, x) -> tuple | None:
    """(function, args) of the plain torch function ``module`` runs on ``x`` with the tensors of
    ``state``: what ``direct_call`` calls at a step and ``inline_call`` puts in the graph (a
    convolution's form is a bound method: ``direct_call`` runs it, the graph does not hold it)."""
    kind = type(module)
    if kind is nn.Linear and set(state) <= {"weight", "bias"}:
        return torch.nn.functional.linear, (x, state["weight"], state.get("bias"))
    if kind is nn.LayerNorm and set(state) <= {"weight", "bias"}:
        return torch.nn.functional.layer_norm, (x, tuple(module.normalized_shape), state.get("weight"),
                                                state.get("bias"), module.eps)
    if kind is nn.Embedding and set(state) == {"weight"}:
        return torch.nn.functional.embedding, (x, state["weight"], module.padding_idx, module.max_norm,
                                               module.norm_type, module.scale_grad_by_freq, module.sparse)
    return None


def _outputs_come_cut(call: LocalCall, uses: list) -> bool:
    """Does the op on local shards return every output already cut as its layout says, so that
    ``local_extent`` has nothing to do? Yes where each mesh axis that cuts a dim of an output
    also cuts that dim in some tensor the op reads (the op maps it through); no for a dim only
    the output has (a slice's fresh dim, a factory's), which comes out whole."""
    node, layout = call.node, call.layout
    for a, d in enumerate(layout.axis_dims):
        if d is None or layout.split_counts.get(d, 1) <= 1:
            continue
        if not any(d in dims for spec in node.outputs for dims in spec.axes):
            continue
        fed_cut = False
        for u in uses:
            p = u.placements[a] if u.spec is not None else None
            if p is not None and p.is_shard() and d in u.spec.axes[p.dim % len(u.spec.axes)]:
                fed_cut = True
                break
        if not fed_cut:
            return False
    return True
