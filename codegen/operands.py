"""Which IR operand each argument of a traced call is, and how the node reads it.

The traced graph (torch.fx's or torch.export's) names a call's arguments by fx nodes; the IR
names a node's operands by source (``input:x``, ``param:fc1.weight``, a node name). Pairing them
once, when the program is built, gives every argument its placements: forward, gradient,
additive (added once) and strided (minor-dim blocks taken locally).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.fx as fx
from torch.distributed.tensor import Replicate

from autopar.core.ir import Node, Operand, TensorSpec

from .placements import LayoutError, NodeLayout, Placements, StridedCut, grad_placements

NO_KEY = object()  # an fx argument that is no operand of the node (a constant, a shape)


@dataclass(frozen=True)
class OperandKey:
    """What an fx argument is, in IR terms: (source, output) as in ``ir.Operand``."""

    source: str
    output: int = 0


@dataclass(frozen=True)
class Use:
    """How a node reads one tensor: forward and gradient placements, additive mesh axes."""

    placements: Placements
    grads: Placements
    additive: tuple[int, ...] = ()
    spec: TensorSpec | None = None  # the IR's view of the tensor (None: not in the IR)
    strided: tuple[StridedCut, ...] = ()  # minor-dim cuts, taken locally


def operand_key(a: fx.Node, ir_nodes, state: dict[str, str]) -> Any:
    """The IR operand an fx argument stands for (following getitem on a node's tuple output and
    single-input pass-throughs the tracer left out of the IR, such as ``contiguous``)."""
    if a.op == "placeholder":
        return OperandKey(f"param:{state[a.name]}") if a.name in state else OperandKey(f"input:{a.name}")
    if a.op == "get_attr":
        return OperandKey(f"param:{a.target}")
    if a.name in ir_nodes:
        return OperandKey(a.name)
    if a.op == "call_function" and getattr(a.target, "__name__", "") == "getitem":
        src, idx = a.args[0], a.args[1]
        if isinstance(src, fx.Node) and src.name in ir_nodes and isinstance(idx, int):
            return OperandKey(src.name, idx)
    tensor_args = list(a.all_input_nodes)
    if len(tensor_args) == 1:
        return operand_key(tensor_args[0], ir_nodes, state)
    return NO_KEY


class OperandMatcher:
    """Pairs the tensors a call reads with the node's IR operands and their placements."""

    def __init__(self, node: Node, layout: NodeLayout):
        self.node = node
        self.layout = layout
        self.used: set[tuple[str, int]] = set()

    def match(self, key: Any, ndim: int) -> Use:
        node = self.node
        for i, op in enumerate(node.inputs):
            if self._is(key, op, ("in", i)):
                return self._input(i)
        for i, op in enumerate(node.params):
            if self._is(key, op, ("param", i)):
                return self._param(i)
        for i, op in enumerate(node.inputs):  # positional: the IR lists data inputs in call order
            if ("in", i) not in self.used and len(op.spec.shape) == ndim:
                self.used.add(("in", i))
                return self._input(i)
        raise LayoutError(f"node {node.name}: cannot tell which operand {key} is "
                          f"(inputs {[o.source for o in node.inputs]}, "
                          f"params {[o.source for o in node.params]})")

    def param(self, qualified: str) -> Use:
        for i, op in enumerate(self.node.params):
            if op.source == f"param:{qualified}":
                self.used.add(("param", i))
                return self._param(i)
        owner = list(self.layout.axis_dims)  # a parameter the IR left out: replicated
        rep = tuple(Replicate() for _ in owner)
        return Use(rep, grad_placements(rep, owner))

    def _input(self, i: int) -> Use:
        lay = self.layout
        return Use(lay.inputs[i], lay.input_grads[i], lay.input_additive[i],
                   self.node.inputs[i].spec, lay.input_strided[i])

    def _param(self, i: int) -> Use:
        lay = self.layout
        return Use(lay.params[i], lay.param_grads[i], lay.param_additive[i],
                   self.node.params[i].spec, lay.param_strided[i])

    def _is(self, key: Any, op: Operand, tag: tuple[str, int]) -> bool:
        if not isinstance(key, OperandKey) or tag in self.used:
            return False
        if (op.source, op.output) == (key.source, key.output):
            self.used.add(tag)
            return True
        return False
