"""The sharded module that runs a plan: parameters as DTensors, every node on its own layout.

``shard_module(model, graph, assignment, mesh_shape)`` returns this rank's module. It keeps the
model's parameter names (its children are the model's children), but each parameter is a DTensor
laid out as the node that reads it first is configured, and ``forward`` replays the traced fx
graph node by node:

1. each DTensor input of a node is redistributed to the placements the node's config implies
   (``placements.node_layout``); that is where all forward collectives come from, and the
   backward of the same redistribute is where gradients get reduced back to their producer's
   layout (for a replicated parameter: the data-parallel all-reduce);
2. the node runs on local shards through ``local_map`` with those placements, its outputs
   labelled ``Shard``/``Replicate``/``Partial`` from the IR. DTensor's own op rules are never
   consulted, so a rule that is wrong for some layout (``F.conv2d`` with an in-channel split
   returns wrong values labelled ``Replicate``, see DESIGN.md) cannot bite, and the collectives
   are exactly those of the plan;
   A training batch norm whose batch is split is the one op that runs differently: with global
   statistics (``batchnorm.py``), as the single-device model does;
3. fx nodes that are not IR nodes (``x.shape``, ``getitem`` on a node's tuple output) run as they
   are, on DTensors, which is right for metadata and tuple indexing;
4. the graph's outputs come back as ordinary, replicated tensors (``full_tensor()``).

Inputs are the full (global) tensors, identical on every rank; a node that shards its input just
keeps its slice (a Replicate -> Shard redistribute needs no communication).
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.distributed.tensor.experimental import local_map
from torch.utils import _pytree as pytree

from autopar.core.ir import Graph, Node, Operand, TensorSpec
from autopar.core.tables import Config

from .batchnorm import needs_sync, sync_batch_norm
from .inplace import written_argument
from .op_fixes import causal_rows, mean_scale, vocab_shard
from .ops import LocalCall
from .strided import chunk_index
from .placements import LayoutError, NodeLayout, Placements, StridedCut, grad_placements, \
    node_layout

_NO_KEY = object()  # an fx argument that is no operand of the node (a constant, a shape)


@dataclass(frozen=True)
class OperandKey:
    """What an fx argument is, in IR terms: (source, output) as in ``ir.Operand``."""

    source: str
    output: int = 0


@dataclass
class Program:
    """Everything ``forward`` needs besides the parameters; built once by ``shard_module``."""

    graph: Graph
    assignment: dict[str, Config]
    mesh: DeviceMesh
    layouts: dict[str, NodeLayout]  # one per IR node, by name (= fx node name)
    param_placements: dict[str, Placements]  # qualified name -> placements it is stored with
    scales: dict[str, float] = field(default_factory=dict)  # node -> 1/parts of averaged dims
    writes: dict[str, fx.Node] = field(default_factory=dict)  # in-place node -> the argument it writes
    outputs: str = "replicate"  # "replicate": plain whole tensors; "dtensor": as the plan leaves them

    @property
    def fx_graph(self) -> fx.GraphModule:
        return self.graph.fx_graph


class ShardedModule(nn.Module):
    """This rank's module: the model's children with DTensor parameters, run per the plan."""

    def __init__(self, model: nn.Module, program: Program):
        super().__init__()
        for name, child in model.named_children():
            self.add_module(name, child)
        for name, p in model.named_parameters(recurse=False):
            self.register_parameter(name, p)
        for name, b in model.named_buffers(recurse=False):
            self.register_buffer(name, b)
        self.program = program

    @property
    def mesh(self) -> DeviceMesh:
        return self.program.mesh

    def forward(self, *args, **kwargs):
        return _Runner(self, self.program).run(*self._positional(args, kwargs))

    def _positional(self, args: tuple, kwargs: dict) -> tuple:
        """Keyword inputs in the traced placeholders' order (the Interpreter takes positions)."""
        names = [n.target for n in self.program.fx_graph.graph.nodes if n.op == "placeholder"]
        kwargs = dict(kwargs)
        rest = []
        for name in names[len(args):]:
            if name not in kwargs:
                break
            rest.append(kwargs.pop(name))
        if kwargs:
            raise TypeError(f"inputs {sorted(kwargs)} do not follow the traced inputs {names} in order")
        return (*args, *rest)


def shard_module(model: nn.Module, graph: Graph, assignment: dict[str, Config],
                 mesh_shape: tuple[int, ...], device_mesh: DeviceMesh | None = None,
                 outputs: str = "replicate") -> ShardedModule:
    """This rank's sharded copy of ``model`` (the model itself is left as it is).

    ``graph`` is the IR traced from ``model`` (``graph.fx_graph`` its fx GraphModule, IR node
    names = fx node names); ``assignment`` maps node names to configs (missing: replicated).
    Needs an initialized default process group whose size is the product of ``mesh_shape``.
    ``outputs``: "replicate" (default) returns plain whole tensors, the same on every rank;
    "dtensor" returns the graph's outputs as DTensors in the layout the plan leaves them (no
    gather: for a caller that keeps working on shards).
    """
    if outputs not in ("replicate", "dtensor"):
        raise ValueError(f"outputs must be 'replicate' or 'dtensor', not {outputs!r}")
    mesh_shape = tuple(mesh_shape)
    if graph.fx_graph is None:
        raise LayoutError("shard_module needs graph.fx_graph, the fx GraphModule the IR came from")
    mesh = device_mesh if device_mesh is not None else init_device_mesh(
        "cpu", mesh_shape, mesh_dim_names=tuple(f"mesh{a}" for a in range(len(mesh_shape))))
    if tuple(mesh.shape) != mesh_shape:
        raise LayoutError(f"device mesh {tuple(mesh.shape)} is not the plan's mesh {mesh_shape}")
    flatten_groups(mesh)
    layouts = {n.name: node_layout(n, assignment.get(n.name), mesh_shape) for n in graph.nodes}
    stored = _stored_placements(graph, layouts)
    model = copy.deepcopy(model)
    _distribute_state(model, mesh, stored)
    program = Program(graph, dict(assignment), mesh, layouts, stored, outputs=outputs)
    fx_nodes = {n.name: n for n in graph.fx_graph.graph.nodes}
    for node in graph.nodes:
        if node.name in fx_nodes:
            n = fx_nodes[node.name]
            program.scales[node.name] = mean_scale(n, node, layouts[node.name])
            written = written_argument(n, model.get_submodule(n.target) if n.op == "call_module" else None)
            if written is not None:
                program.writes[node.name] = written
    return ShardedModule(model, program)


def flatten_groups(mesh: DeviceMesh) -> None:
    """Register a flattened mesh for every ascending group of 2+ mesh dims.

    With one, DTensor runs a redistribution that touches several mesh axes in the same way (a
    (Partial, Partial) -> Replicate loss, a (Shard(0), Shard(0)) gather) as ONE collective over
    the group instead of one per axis, which is what the cost model prices
    (``cost_models/comm.py``). ``_flatten`` is what DTensor's own warning asks for; a mesh without
    dim names (a caller's) keeps the per-axis collectives, which are just as correct.
    """
    names = mesh.mesh_dim_names
    if not names or mesh.ndim < 2:
        return
    for k in range(2, mesh.ndim + 1):
        for group in itertools.combinations(names, k):
            mesh[group]._flatten()


def _stored_placements(graph: Graph, layouts: dict[str, NodeLayout]) -> dict[str, Placements]:
    """Each parameter is stored as its first reader wants it; later readers redistribute.

    """
    stored: dict[str, Placements] = {}
    for node in graph.nodes:
        for op, pl in zip(node.params, layouts[node.name].params):
            stored.setdefault(op.source.removeprefix("param:"), pl)
    return stored


def _distribute_state(model: nn.Module, mesh: DeviceMesh, stored: dict[str, Placements]) -> None:
    """Every parameter and buffer as a DTensor; a tied one (one tensor, several names) once."""
    replicate = tuple(Replicate() for _ in range(mesh.ndim))
    for named, make in ((model.named_parameters, _parameter), (model.named_buffers, _buffer)):
        aliases: dict[int, list[str]] = {}
        tensors: dict[int, torch.Tensor] = {}
        for name, t in named(remove_duplicate=False):
            aliases.setdefault(id(t), []).append(name)
            tensors[id(t)] = t
        for key, names in aliases.items():
            placements = next((stored[n] for n in names if n in stored), replicate)
            new = make(tensors[key], mesh, placements)
            for name in names:
                owner, leaf = _owner(model, name)
                (owner._parameters if make is _parameter else owner._buffers)[leaf] = new


def _parameter(p: torch.Tensor, mesh: DeviceMesh, placements: Placements) -> nn.Parameter:
    return nn.Parameter(distribute_tensor(p.detach(), mesh, placements), requires_grad=p.requires_grad)


def _buffer(b: torch.Tensor, mesh: DeviceMesh, placements: Placements) -> torch.Tensor:
    return distribute_tensor(b, mesh, placements)


def _owner(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, leaf = name.rpartition(".")
    return (model.get_submodule(path) if path else model), leaf


class _Runner(fx.Interpreter):
    """One forward pass: the fx graph replayed with every IR node run on its layout."""

    def __init__(self, root: ShardedModule, program: Program):
        super().__init__(root, garbage_collect_values=True, graph=program.fx_graph.graph)
        self.program = program
        self.root = root

    # -- graph boundary -------------------------------------------------------------------

    def placeholder(self, target, args, kwargs):
        value = super().placeholder(target, args, kwargs)
        return self._replicated(value)

    def get_attr(self, target, args, kwargs):
        try:
            value = self.fetch_attr(target)
        except (AttributeError, RuntimeError):  # a constant the tracer stored on its GraphModule only
            value = getattr(self.program.fx_graph, target)
        return self._replicated(value)

    def output(self, target, args, kwargs):
        if self.program.outputs == "dtensor":
            return args[0]
        return pytree.tree_map(lambda v: v.full_tensor() if isinstance(v, DTensor) else v, args[0])

    def _replicated(self, value):
        if isinstance(value, torch.Tensor) and not isinstance(value, DTensor):
            mesh = self.program.mesh
            return DTensor.from_local(value, mesh, [Replicate()] * mesh.ndim, run_check=False)
        return value

    # -- nodes ----------------------------------------------------------------------------

    def run_node(self, n: fx.Node) -> Any:
        if n.op.startswith("call_") and n.name in self.program.layouts:
            with self._set_current_node(n):
                out = self._run_sharded(n, self.program.graph.node(n.name))
            written = self.program.writes.get(n.name)
            if written is not None and written in self.env:
                self.env[written] = out  # later readers of the written tensor see the new value
            return out
        return super().run_node(n)

    def _run_sharded(self, n: fx.Node, node: Node) -> Any:
        layout = self.program.layouts[node.name]
        mesh = self.program.mesh
        if n.op == "call_module":
            module = self.root.get_submodule(n.target)
            if needs_sync(node, layout, module):
                return sync_batch_norm(module, self.env[n.args[0]], node, layout, mesh)
        flat, spec = pytree.tree_flatten((n.args, n.kwargs))  # fx nodes, to name operands
        values, spec_v = pytree.tree_flatten(self.fetch_args_kwargs_from_env(n))  # their values
        if spec_v != spec:
            raise LayoutError(f"node {node.name}: arguments changed structure when resolved")
        operands = _OperandMatcher(node, layout)
        slots, uses = [], []
        for i, (a, v) in enumerate(zip(flat, values)):
            if isinstance(v, DTensor):
                slots.append(i)
                uses.append(operands.match(self._key(a), v))
        module, names = None, []
        if n.op == "call_module":
            module = self.root.get_submodule(n.target)
            for name, t in _module_state(module):
                names.append(name)
                uses.append(operands.param(f"{n.target}.{name}" if n.target else name))
                values.append(t)
                slots.append(len(values) - 1)
        tensors = [values[i].redistribute(mesh, u.placements) for i, u in zip(slots, uses)]
        coord = mesh.get_coordinate() or [0] * mesh.ndim
        drop = {j for j, u in enumerate(uses) if any(coord[a] != 0 for a in u.additive)}
        flat_consts = [None if i in slots else v for i, v in enumerate(values[:len(flat)])]
        mesh_shape = tuple(mesh.shape)

        def index(dim: str) -> int:
            return chunk_index(dim, layout.axis_dims, mesh_shape, coord)

        call = LocalCall(n, node, layout, module, flat_consts, spec, slots[:len(slots) - len(names)],
                         names, self.program.scales.get(node.name, 1.0), drop,
                         vocab_shard(node, layout, mesh_shape, coord),
                         causal_rows(node, layout, index), [(u.spec, u.strided) for u in uses], index,
                         writes_first=node.name in self.program.writes)
        run = local_map(call, out_placements=tuple(layout.outputs),
                        in_placements=tuple(u.placements for u in uses),
                        in_grad_placements=tuple(u.grads for u in uses), device_mesh=mesh)
        # local_map leaves outputs plain when no input was a DTensor (a factory such as arange,
        # which the IR replicates): label them replicated like every other value
        return pytree.tree_map(self._replicated, call.rebuild(run(*tensors)))

    def _key(self, a: fx.Node) -> Any:
        """The IR operand an fx argument stands for (following getitem on a node's tuple)."""
        ir_nodes = self.program.layouts
        if a.op == "placeholder":
            return OperandKey(f"input:{a.name}")
        if a.op == "get_attr":
            return OperandKey(f"param:{a.target}")
        if a.name in ir_nodes:
            return OperandKey(a.name)
        if a.op == "call_function" and getattr(a.target, "__name__", "") == "getitem":
            src, idx = a.args[0], a.args[1]
            if isinstance(src, fx.Node) and src.name in ir_nodes and isinstance(idx, int):
                return OperandKey(src.name, idx)
        tensor_args = [x for x in a.all_input_nodes]
        if len(tensor_args) == 1:  # a pass-through the tracer left out of the IR (contiguous)
            return self._key(tensor_args[0])
        return _NO_KEY


def _module_state(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return list(module.named_parameters()) + list(module.named_buffers())


@dataclass(frozen=True)
class _Use:
    """How a node reads one tensor: forward and gradient placements, additive mesh axes."""

    placements: Placements
    grads: Placements
    additive: tuple[int, ...] = ()
    spec: TensorSpec | None = None  # the IR's view of the tensor (None: not in the IR)
    strided: tuple[StridedCut, ...] = ()  # minor-dim cuts, taken locally


class _OperandMatcher:
    """Pairs the DTensors a call reads with the node's IR operands and their placements."""

    def __init__(self, node: Node, layout: NodeLayout):
        self.node = node
        self.layout = layout
        self.used: set[tuple[str, int]] = set()

    def match(self, key: Any, value: DTensor) -> _Use:
        node = self.node
        for i, op in enumerate(node.inputs):
            if self._is(key, op, ("in", i)):
                return self._input(i)
        for i, op in enumerate(node.params):
            if self._is(key, op, ("param", i)):
                return self._param(i)
        for i, op in enumerate(node.inputs):  # positional: the IR lists data inputs in call order
            if ("in", i) not in self.used and len(op.spec.shape) == value.ndim:
                self.used.add(("in", i))
                return self._input(i)
        raise LayoutError(f"node {node.name}: cannot tell which operand {key} is "
                          f"(inputs {[o.source for o in node.inputs]}, "
                          f"params {[o.source for o in node.params]})")

    def param(self, qualified: str) -> _Use:
        for i, op in enumerate(self.node.params):
            if op.source == f"param:{qualified}":
                self.used.add(("param", i))
                return self._param(i)
        owner = list(self.layout.axis_dims)  # a parameter the IR left out: replicated
        rep = tuple(Replicate() for _ in owner)
        return _Use(rep, grad_placements(rep, owner))

    def _input(self, i: int) -> _Use:
        lay = self.layout
        return _Use(lay.inputs[i], lay.input_grads[i], lay.input_additive[i],
                    self.node.inputs[i].spec, lay.input_strided[i])

    def _param(self, i: int) -> _Use:
        lay = self.layout
        return _Use(lay.params[i], lay.param_grads[i], lay.param_additive[i],
                    self.node.params[i].spec, lay.param_strided[i])

    def _is(self, key: Any, op: Operand, tag: tuple[str, int]) -> bool:
        if not isinstance(key, OperandKey) or tag in self.used:
            return False
        if (op.source, op.output) == (key.source, key.output):
            self.used.add(tag)
            return True
        return False
