"""Check a graph's axis maps against torch: does a split of a dim compute the split of the output?

For one IR node and one of its splittable dims, every operand is cut into ``parts`` along the
tensor axes that dim indexes (a contiguous cut for the major dim of an axis, a strided one for a
minor dim), the node's own aten op runs on each piece, and the pieces must equal the matching cuts
of the whole output; for a reduction dim they must add up (or average, for a mean) to it. This is
independent of the rules: it runs the real op on real values recorded from the exported program.

Where a split is by design not a local run of the op, the check skips it and says so: the vocab
dim of an embedding (devices look up only the rows they own), a training-mode batch norm's batch
(per-shard statistics, as in data parallelism), random ops.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.export.graph_signature import TensorArgument

from autopar.core.ir import Graph, Node

aten = torch.ops.aten
RANDOM = {"dropout", "native_dropout", "rand", "randn", "bernoulli", "rand_like", "randn_like"}
SIZE_ARGS = {"view", "reshape", "_unsafe_view", "expand"}  # arg 1 is the output shape: localized


@dataclass
class Outcome:
    node: str
    dim: str
    ok: bool
    why: str = ""


def record(graph: Graph, args: tuple = (), kwargs: dict | None = None) -> dict[str, Any]:
    """Every fx node's value (cloned when made) from running the exported program on real inputs."""
    ep = graph.program
    state = {**ep.state_dict, **ep.constants}
    user = iter(graph.call.flatten(args, kwargs or {}))
    flat = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind.name == "USER_INPUT":
            flat.append(next(user) if isinstance(spec.arg, TensorArgument) else spec.arg.value)
        else:
            flat.append(state[spec.target])
    values: dict[str, Any] = {}

    class Rec(fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            values[n.name] = pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, out)
            return out

    with torch.no_grad():
        Rec(ep.graph_module).run(*flat)
    for spec in ep.graph_signature.input_specs:  # parameters by their IR source name too
        if spec.kind.name != "USER_INPUT":
            values[f"param:{spec.target}"] = state[spec.target]
    return values


def _source(a: fx.Node, graph: Graph) -> tuple[str, int]:
    sig = graph.program.graph_signature
    state = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    if a.op == "placeholder":
        return (f"param:{state[a.name]}", 0) if a.name in state else (f"input:{a.name}", 0)
    if a.target is operator.getitem:
        return (a.args[0].name, a.args[1])
    return (a.name, 0)


def _cut(t: torch.Tensor, axes, dims: dict[str, int], dim: str, r: int, parts: int) -> torch.Tensor:
    for i, axis in enumerate(axes):
        if dim not in axis:
            continue
        sizes = [dims[d] for d in axis]
        if math.prod(sizes) != t.shape[i]:
            raise ValueError(f"axis {i} of size {t.shape[i]} is not {axis}={sizes}")
        k = axis.index(dim)
        shaped = t.reshape(t.shape[:i] + tuple(sizes) + t.shape[i + 1:])
        chunk = sizes[k] // parts
        piece = shaped.narrow(i + k, r * chunk, chunk)
        t = piece.reshape(t.shape[:i] + (-1,) + t.shape[i + 1:])
    return t.contiguous()  # a device's shard is its own tensor


def check(graph: Graph, values: dict[str, Any], node: Node, dim: str, parts: int = 2) -> Outcome:
    try:
        return _check(graph, values, node, dim, parts)
    except Exception as e:  # the op refused the pieces, or they do not fit the axis map: the map is wrong
        return Outcome(node.name, dim, False, f"{type(e).__name__}: {str(e)[:160]}")


def _check(graph: Graph, values: dict[str, Any], node: Node, dim: str, parts: int) -> Outcome:
    fxnode = next(n for n in graph.fx_graph.graph.nodes if n.name == node.name)
    target = fxnode.target
    name = target.overloadpacket.__name__ if isinstance(target, torch._ops.OpOverload) else str(target)
    d = node.dim(dim)
    if name.rstrip("_") in RANDOM and not (name == "dropout" and fxnode.args[1] == 0):
        return Outcome(node.name, dim, True, "skipped: random")
    if node.op == "embedding" and dim == "v":
        return Outcome(node.name, dim, True, "skipped: vocab-parallel lookup is not a local run")
    if node.op == "batch_norm" and dim == "b" and node.attrs.get("training"):
        return Outcome(node.name, dim, True, "skipped: per-shard batch statistics (data parallel semantics)")
    sizes = {x.name: x.size for x in node.dims}
    axes = {(o.source, o.output): o.spec.axes for o in node.inputs + node.params}
    bias_like = {k for k, a in axes.items() if d.reduction and not any(dim in ax for ax in a)} \
        if node.op in ("linear", "matmul", "conv1d", "conv2d") else set()
    if not d.reduction and not any(dim in ax for a in axes.values() for ax in a):
        # the operands are read whole (a partial slice's fresh dim): each device keeps its piece
        return Outcome(node.name, dim, True, "whole operands: trivially a cut of the output")
    full = values[fxnode.name]
    outs = [full] if isinstance(full, torch.Tensor) else [t for t in pytree.tree_leaves(full) if isinstance(t, torch.Tensor)]
    pieces = []
    for r in range(parts):
        def arg(a, r=r):
            if not isinstance(a, fx.Node):
                return a
            key = _source(a, graph)
            t = values[key[0]] if key[0].startswith("param:") else values[a.name]
            if not isinstance(t, torch.Tensor):
                return t
            t = t.clone()
            if key in bias_like and r > 0:
                return torch.zeros_like(t)
            return _cut(t, axes[key], sizes, dim, r, parts) if key in axes else t
        args = fx.node.map_arg(fxnode.args, arg)
        kwargs = fx.node.map_arg(fxnode.kwargs, arg)
        if name in SIZE_ARGS:
            local = _cut(outs[0], node.outputs[0].axes, sizes, dim, r, parts).shape
            args = (args[0], list(local)) + tuple(args[2:])
        elif name in ("conv2d", "conv1d") and dim == "g":  # the group count is localized too
            args = tuple(args[:6]) + (args[6] // parts,)
        with torch.no_grad():
            got = target(*args, **kwargs)
        pieces.append([got] if isinstance(got, torch.Tensor) else [t for t in pytree.tree_leaves(got)
                                                                   if isinstance(t, torch.Tensor)])
    for j, (whole, spec) in enumerate(zip(outs, node.outputs)):
        if d.reduction and not any(dim in a for a in spec.axes):
            total = sum(p[j].double() for p in pieces)
            ok = torch.allclose(total, whole.double(), rtol=1e-4, atol=1e-5) or \
                torch.allclose(total / parts, whole.double(), rtol=1e-4, atol=1e-5)
        else:
            ok = all(torch.allclose(p[j].double(), _cut(whole, spec.axes, sizes, dim, r, parts).double(),
                                    rtol=1e-4, atol=1e-5) and p[j].shape == _cut(whole, spec.axes, sizes, dim, r, parts).shape
                     for r, p in enumerate(pieces))
        if not ok:
            return Outcome(node.name, dim, False, f"output {j} of {name} differs")
    return Outcome(node.name, dim, True)


def check_graph(graph: Graph, values: dict[str, Any], parts: int = 2) -> list[Outcome]:
    """Every splittable dim (divisible by ``parts``) of every node."""
    found = []
    for node in graph.nodes:
        for d in node.dims:
            if d.splittable and d.size % parts == 0 and d.size >= parts:
                found.append(check(graph, values, node, d.name, parts))
    return found
