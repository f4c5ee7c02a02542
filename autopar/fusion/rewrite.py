"""The fx rewrite: K models' graph -> one graph over K stacked models.

Every value of the new graph is either *shared* (the same for all K models: inputs they all read,
Python ints, shapes) or *stacked* (model k's value is ``v[k]``: a leading dim of size K, the
rest exactly the original's shape). A node whose inputs are all shared is copied unchanged; one
that reads a stacked value is rewritten by a rule (``rules``, ``nn_rules``) that keeps this
convention: a dim argument moves up by one, a broadcast aligns the K dims, a layer with
parameters becomes its fused form, a loss becomes K per-model losses. So the fused graph
computes exactly the K original graphs, and the outputs are the K models' outputs stacked.
"""

from __future__ import annotations

import inspect
import operator
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn

from autopar.core.errors import TraceError
from autopar.fusion.layers import FUSED, fused_layer, stack
from autopar.fusion.trace import Traced


class Rewriter:
    """Builds the fused graph node by node; ``rules`` call its helpers to emit nodes."""

    def __init__(self, traced: Traced, models: list[nn.Module], stacked_inputs: bool,
                 call_rule: Callable, module_rule: Callable):
        self.call_rule, self.module_rule = call_rule, module_rule  # rules.call_rule, nn_rules.module_rule
        self.src, self.values, self.models = traced.gm, traced.values, models
        self.k = len(models)
        self.stacked_inputs = stacked_inputs
        self.graph = fx.Graph()
        self.env: dict[fx.Node, Any] = {}
        self.stacked: set[fx.Node] = set()  # new nodes holding a stacked value (or a tuple of them)
        self.info: dict[fx.Node, Any] = {}  # new node -> the original value (meta): ranks, shapes
        self.root = nn.Module()
        self.current: fx.Node | None = None  # the source node being rewritten (for messages)

    # -- helpers the rules use -----------------------------------------------------------------
    def is_stacked(self, v: Any) -> bool:
        if isinstance(v, fx.Node):
            return v in self.stacked
        if isinstance(v, (list, tuple)):
            return any(self.is_stacked(x) for x in v)
        if isinstance(v, dict):
            return any(self.is_stacked(x) for x in v.values())
        return False

    def rank(self, v: Any) -> int:
        """The original rank of tensor value ``v`` (0 for Python numbers)."""
        orig = self.info.get(v) if isinstance(v, fx.Node) else v
        return orig.dim() if isinstance(orig, torch.Tensor) else 0

    def shape(self, v: Any) -> tuple[int, ...]:
        orig = self.info.get(v) if isinstance(v, fx.Node) else v
        return tuple(orig.shape) if isinstance(orig, torch.Tensor) else ()

    def is_tensor(self, v: Any) -> bool:
        return isinstance(self.info.get(v) if isinstance(v, fx.Node) else v, torch.Tensor)

    def fn(self, target: Callable, *args, **kwargs) -> fx.Node:
        return self.graph.call_function(target, args, kwargs)

    def method(self, name: str, *args, **kwargs) -> fx.Node:
        return self.graph.call_method(name, args, kwargs)

    def mark(self, node: fx.Node, like: Any, stacked: bool = True) -> fx.Node:
        """Record ``node`` as holding a value shaped like original value ``like``."""
        self.info[node] = like
        if stacked:
            self.stacked.add(node)
        return node

    def align(self, x: Any, rank: int) -> Any:
        """A stacked value of original rank r < ``rank`` viewed as (K, 1, .., 1, *shape): it then
        broadcasts against the others as the original did against theirs (right-aligned)."""
        r = self.rank(x)
        if not self.is_stacked(x) or r >= rank:
            return x
        index = (slice(None),) + (None,) * (rank - r)
        return self.fn(operator.getitem, x, index)

    def expand(self, x: Any) -> Any:
        """A shared tensor as a stacked one (a view: the K models read the same values)."""
        if self.is_stacked(x) or not self.is_tensor(x):
            return x
        r = self.rank(x)
        node = self.method("expand", self.method("unsqueeze", x, 0), self.k, *([-1] * r))
        return self.mark(node, self.info.get(x, x))

    def dim(self, d: int, rank: int) -> int:
        """Original dim ``d`` of a rank-``rank`` tensor -> its dim in the stacked tensor."""
        if rank == 0:
            self.fail("a dim argument on a 0-d tensor")
        if not -rank <= d < rank:
            self.fail(f"dim {d} out of range for rank {rank}")
        return d % rank + 1

    def fail(self, why: str):
        n = self.current
        where = f" at {n.op} {getattr(n.target, '__name__', n.target)} ({n.name})" if n is not None else ""
        raise TraceError(f"fuse: cannot fuse{where}: {why}; write that step with supported ops "
                         "(see autopar.fusion.rules) or train these models one by one")

    # -- the walk ----------------------------------------------------------------------------
    def run(self) -> fx.GraphModule:
        self._build_root()
        for n in self.src.graph.nodes:
            self.current = n
            value = self.values.get(n)
            if n.op == "placeholder":
                new = self.graph.placeholder(n.target, default_value=n.args[0] if n.args else inspect.Signature.empty)
                self.env[n] = self.mark(new, value, self.stacked_inputs and isinstance(value, torch.Tensor))
                continue
            if n.op == "get_attr":
                self.env[n] = self._get_attr(n, value)
                continue
            if n.op == "output":
                self.graph.output(fx.map_arg(n.args[0], lambda a: self.env[a]))
                continue
            args = fx.map_arg(n.args, lambda a: self.env[a])
            kwargs = fx.map_arg(n.kwargs, lambda a: self.env[a])
            if n.op == "call_module":
                new, stacked = self.module_rule(self, n, args, kwargs)
            elif not self.is_stacked((args, kwargs)):
                new, stacked = self._copy(n, args, kwargs), False
            else:
                new, stacked = self.call_rule(self, n, args, kwargs)
            if isinstance(new, fx.Node):
                self.mark(new, value, stacked)
            self.env[n] = new
        self.current = None
        self.graph.lint()
        return fx.GraphModule(self.root, self.graph, "Fused" + type(self.models[0]).__name__)

    def _copy(self, n: fx.Node, args, kwargs) -> fx.Node:
        return self.graph.create_node(n.op, n.target, args, kwargs, n.name)

    def _get_attr(self, n: fx.Node, value: Any) -> fx.Node:
        target = n.target
        if not _has_path(self.root, target):  # a constant fx made while tracing: shared
            _set_path(self.root, target, _fetch(self.src, target))
            return self.mark(self.graph.get_attr(target), value, stacked=False)
        node = self.graph.get_attr(target)
        if isinstance(value, torch.Tensor):
            held = _fetch(self.root, target)
            if tuple(held.shape) != (self.k,) + tuple(value.shape):  # a fused layer's flat layout
                node = self.method("view", node, self.k, *value.shape)
        return self.mark(node, value, stacked=isinstance(value, torch.Tensor))

    # -- the fused module tree: model 0's, with every layer holding K models' state --------------
    def _build_root(self) -> None:
        ref = self.models[0]
        used = {n.target for n in self.src.graph.nodes if n.op == "call_module"}
        owners = sorted({name.rpartition(".")[0] for name, _ in
                         [*ref.named_parameters(), *ref.named_buffers()]}, key=lambda p: p.count("."))
        for path in owners:
            mods = [m.get_submodule(path) for m in self.models]
            if type(mods[0]) in FUSED:
                _set_path(self.root, path, fused_layer(mods))
                continue
            if path in used:
                self.current = next(n for n in self.src.graph.nodes if n.op == "call_module" and n.target == path)
                fused_layer(mods)  # raises: a leaf module with state and no fused form
            holder = _container(self.root, path)
            for name, p in mods[0].named_parameters(recurse=False):
                holder.register_parameter(name, nn.Parameter(stack([getattr(m, name) for m in mods]),
                                                             requires_grad=p.requires_grad))
            for name, _ in mods[0].named_buffers(recurse=False):
                persistent = name not in mods[0]._non_persistent_buffers_set
                holder.register_buffer(name, stack([getattr(m, name) for m in mods]), persistent=persistent)
        for path in used:  # stateless leaves (activations, pools, losses) are shared as they are
            if not _has_path(self.root, path):
                _set_path(self.root, path, ref.get_submodule(path))


def arg(args, kwargs, pos: int, name: str, default=None):
    """Argument ``name`` of a call, given by keyword or at position ``pos``."""
    if name in kwargs:
        return kwargs[name]
    return args[pos] if len(args) > pos else default


def with_arg(args, kwargs, pos: int, name: str, value):
    """The call's arguments with ``name`` (keyword or position ``pos``) set to ``value``."""
    if name in kwargs or len(args) <= pos:
        return args, {**kwargs, name: value}
    return args[:pos] + (value,) + args[pos + 1:], kwargs


def _fetch(root: nn.Module, target: str) -> Any:
    obj = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _has_path(root: nn.Module, target: str) -> bool:
    obj = root
    for part in target.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def _container(root: nn.Module, path: str) -> nn.Module:
    obj = root
    for part in filter(None, path.split(".")):
        if not hasattr(obj, part):
            obj.add_module(part, nn.Module())
        obj = getattr(obj, part)
    return obj


def _set_path(root: nn.Module, path: str, value: Any) -> None:
    parent, _, name = path.rpartition(".")
    holder = _container(root, parent)
    if isinstance(value, nn.Module):
        if hasattr(holder, name) and isinstance(getattr(holder, name), nn.Module):
            existing = getattr(holder, name)  # a container made earlier for a child: keep its children
            for child_name, child in existing.named_children():
                value.add_module(child_name, child)
        holder.add_module(name, value)
    elif isinstance(value, torch.Tensor):
        holder.register_buffer(name, value)
    else:
        setattr(holder, name, value)
