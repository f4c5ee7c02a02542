"""The part both front ends share: an fx graph whose node values are known -> ``ir.Node``s.

``Builder`` walks the nodes in order and emits one ir.Node per tensor op through the rules;
shapes, sizes and arithmetic on them become constants (no node), symbolic sizes (a dynamic batch)
their example value. ``output_leaves`` turns the model's output structure into the graph's output
list and the ``OutputLeaf``s that rebuild it.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from autopar.core.call import OutputLeaf
from autopar.core.ir import FROZEN_PARAMS, Node, TensorSpec
from autopar.frontend.rules import build_node
from autopar.frontend.rules.base import Call, Tensor, collect_tensors, signature
from autopar.frontend.rules.sites import ATTRIBUTES, FACTORY, Site


class Dropped:
    """An output leaf a training step does not use and torch cannot trace (a key/value cache object)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class Builder:
    """Walks an fx graph whose node values are known and emits one ir.Node per tensor op.

    ``env`` maps each fx node to what later nodes see: a ``Tensor`` (with its operand source),
    a tuple/list of them (multi-output ops; ``getitem`` just picks one), or a Python constant.
    """

    frontend = ""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.env: dict[fx.Node, Any] = {}
        self.nodes: list[Node] = []
        self.inputs: dict[str, TensorSpec] = {}
        # the state that takes no gradient: buffers and parameters with requires_grad=False
        self.frozen = {name for name, _ in model.named_buffers(remove_duplicate=False)} | \
            {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}

    # the front end provides these two
    def value(self, node: fx.Node) -> Any:
        raise NotImplementedError

    def site(self, node: fx.Node, args: tuple, kwargs: dict) -> tuple[Site, dict] | None:
        raise NotImplementedError

    def module_of(self, node: fx.Node) -> str:
        stack = node.meta.get("nn_module_stack")
        if not stack:
            return ""
        last = list(stack.values())[-1]
        return last[0] if isinstance(last, tuple) else str(last)

    def resolve(self, arg: Any) -> Any:
        return fx.node.map_aggregate(arg, lambda a: self.env[a] if isinstance(a, fx.Node) else a)

    def add_input(self, node: fx.Node, name: str) -> None:
        v = self.value(node)
        if isinstance(v, torch.Tensor):
            t = tensor(v, f"input:{name}")
            self.inputs[name] = TensorSpec(t.shape, t.dtype, ((),) * t.ndim)
            self.env[node] = t
        else:
            self.env[node] = concrete(v)

    def add_call(self, node: fx.Node) -> None:
        value = self.value(node)
        args, kwargs = self.resolve(node.args), self.resolve(node.kwargs)
        if not has_tensor(value):  # shapes, sizes and arithmetic on them: constants, no node
            self.env[node] = concrete(value)
            return
        if node.target is getattr and isinstance(args[0], Tensor) and args[1] not in ATTRIBUTES \
                and not isinstance(value, torch.Tensor):  # .shape, .dtype: constants
            self.env[node] = concrete(value)
            return
        if node.target is operator.getitem and isinstance(args[0], (list, tuple)):
            self.env[node] = args[0][args[1]]  # one output of a multi-output node: Operand(output=j)
            return
        found = self.site(node, args, kwargs)
        outs = tuple(tensor(t) for t in flat_tensors(value))
        if found is None:
            site, bound = opaque_site(self.target_name(node)), {"args": args, "kwargs": kwargs}
        else:
            site, bound = found
        if not flat_tensors((list(args), kwargs)):  # torch.ones(T, T), arange...
            site = opaque_site(site.target, FACTORY)
            bound = {"args": args, "kwargs": kwargs}
        call = Call(site.op, site.target, bound, outs, dict(site.fixed))
        module = node.target if node.op == "call_module" else self.module_of(node)
        built = build_node(node.name, module, call)
        frozen = tuple(k for k, p in enumerate(built.params) if p.source.removeprefix("param:") in self.frozen)
        if frozen:
            built.attrs[FROZEN_PARAMS] = frozen
        self.nodes.append(built)
        self.env[node] = _relabel(value, node.name, iter(range(len(outs))))

    def target_name(self, node: fx.Node) -> str:
        if node.op == "call_method":
            return f"Tensor.{node.target}"
        if node.target is getattr and isinstance(node.args[1], str):  # a tensor attribute: x.real, x.imag
            return f"Tensor.{node.args[1]}"
        if node.op == "call_module":
            return f"torch.nn.{type(self.model.get_submodule(node.target)).__name__}"
        t = node.target
        return str(t) if isinstance(t, torch._ops.OpOverload) else f"{getattr(t, '__module__', '')}.{getattr(t, '__name__', t)}"


def output_leaves(leaves: list[tuple[str, Any]]) -> tuple[list[tuple[str, int]], tuple[OutputLeaf, ...]]:
    """(``Graph.outputs``, the ``OutputLeaf``s) of the model's output leaves ``[(path, value)]``.

    A value is a rules ``Tensor`` (a graph output), a ``Dropped`` leaf, or a constant returned as is.
    """
    outputs: list[tuple[str, int]] = []
    out_leaves = []
    for path, v in leaves:
        if isinstance(v, Tensor):
            out_leaves.append(OutputLeaf(path, output=len(outputs)))
            outputs.append((v.source, v.output))
        elif isinstance(v, Dropped):
            out_leaves.append(OutputLeaf(path, dropped=v.reason))
        else:
            out_leaves.append(OutputLeaf(path, value=v))
    return outputs, tuple(out_leaves)


def opaque_site(target: str, reason: str = "") -> Site:
    return Site("opaque", signature("*args, **kwargs"), target,
                {"reason": reason or f"no split rule for {target}; replicated"})


def bind(site: Site, args: tuple, kwargs: dict) -> tuple[Site, dict]:
    try:
        return site, site.bind(args, kwargs)
    except TypeError as e:
        return opaque_site(site.target, f"unexpected arguments for {site.target}: {e}"), \
            {"args": args, "kwargs": kwargs}


def as_int(v: Any) -> int:
    """A size as a plain int: a symbolic size (a dynamic batch) as its example value, without a guard."""
    if isinstance(v, torch.SymInt):
        from torch.fx.experimental.symbolic_shapes import optimization_hint

        try:
            return int(optimization_hint(v))
        except Exception:
            return int(v)
    return int(v)


def tensor(t: torch.Tensor, source: str = "", output: int = 0) -> Tensor:
    return Tensor(tuple(as_int(s) for s in t.shape), str(t.dtype).replace("torch.", ""), source, output)


def has_tensor(v: Any) -> bool:
    return bool(flat_tensors(v))


def flat_tensors(v: Any) -> list:
    found: list = []
    collect_tensors(v, found, (torch.Tensor, Tensor))
    return found


def _relabel(value: Any, name: str, counter) -> Any:
    """The node's result with every tensor replaced by its Operand-like ``Tensor(name, j)``."""
    if isinstance(value, torch.Tensor):
        return tensor(value, name, next(counter))
    if isinstance(value, (list, tuple)):
        items = [_relabel(v, name, counter) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    return value


def concrete(v: Any) -> Any:
    """torch.Size and SymInts as plain Python ints/tuples, so rules only see static numbers."""
    if isinstance(v, torch.Size):
        return tuple(as_int(s) for s in v)
    if isinstance(v, torch.SymInt):
        return as_int(v)
    if isinstance(v, (torch.SymFloat, torch.SymBool)):
        return v.node.hint if v.node.has_hint() else v
    if isinstance(v, (list, tuple)):
        return type(v)(concrete(x) for x in v) if not hasattr(v, "_fields") else v
    return v
