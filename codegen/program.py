"""The per-rank program: the traced graph rewritten once into a GraphModule on local shards.

Every IR node becomes one call on this rank's shards, preceded by a ``Reshard`` for each operand
whose layout differs from its producer's (forward and backward collectives, from the IR and the
plan): the traced op itself, with its shape arguments localized, as a node of the graph
(``ops.inline_call``: no Python of autopar's runs for it at a step), or, where the op needs one of
the per-op repairs of ``ops.LocalCall`` (a dropped additive term, minor-dim cuts, a vocabulary
shard, a causal mask's rows, an output that comes out whole, ...), a ``NodeCall`` module that
runs it. Values that are not tensors (sizes, shapes) are the traced constants, so the
program's shapes are static: the batch it was compiled for. Parameters and buffers come in as
placeholders (the caller passes their local shards), then the user's inputs; outputs leave as
whole tensors (``outputs="replicate"``) or as the plan leaves them (``"local"``). It reads the graph either
frontend made (torch.fx: torch functions, methods, leaf modules; torch.export: ATen ops with
parameters as placeholders): one builder for both.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.utils import _pytree as pytree

from autopar.core.ir import METADATA_READS, Graph, Node
from autopar.core.tables import Config

from .batchnorm import needs_sync, needs_sync_op
from .built import Boundary, Program
from .calls import NodeCall, SyncBatchNorm, SyncBatchNormOp
from .counted import add_count, count_operands, hoist_counts
from .devices import constant_on, makes_on_device, on_device, rank_device
from .experts import experts_module, own_weights, runs_experts
from .inplace import IN_PLACE, STATE_WRITE, Writes, aliasing, refusal, through_storage, write_state, written_argument
from .op_fixes import balance_of, causal_rows, counted_mean, mean_scale, ring_layouts, vocab_shard, whole_dropout
from .operands import NO_KEY, OperandMatcher, Use, operand_key
from .ops import LocalCall, inline_call
from .placements import LayoutError, NodeLayout, Placements, node_layout
from .runtime import OutputReshard, Reshard, ReshardSpec, grad_target, needs_reshard
from .strided import chunk_index
from .training import PLAIN, ProgramTraining, block_of, cast_placeholders, recompute_blocks, tag_new_nodes
from .values import (aliases, concrete, describe, free_name, has_tensor, is_pl, is_state, local_groups,
                     split_words, state_names, traced_values)
from .uneven import with_uneven_batch
from .weight_views import lifted_weight


@dataclass
class _Value:
    """A value of the program: its node (or a constant) and, per tensor leaf, its placements."""

    node: Any
    placements: Any = None  # Placements for a tensor; a tree of them for a tuple; None otherwise


def build(graph: Graph, assignment: dict[str, Config], mesh: DeviceMesh, model: nn.Module,
          outputs: str = "replicate", inputs: str = "global", training: ProgramTraining = PLAIN, boundary=None) -> Program:
    """This rank's program for ``graph`` under ``assignment`` on ``mesh``; ``model`` is the
    compiled module (its children are called by fx leaf-module nodes). ``inputs``: "global" (every
    rank passes the whole batch) or "local" (each its slice over the data-parallel axes).
    ``training``: mixed-precision casts and recomputed blocks (``training.py``); ``boundary``: ``Boundary``."""
    if inputs not in ("global", "local"):
        raise ValueError(f"inputs must be 'global' or 'local', not {inputs!r}")
    return _Builder(graph, assignment, mesh, model, outputs, inputs, training, boundary).run()


class _Builder:
    def __init__(self, graph, assignment, mesh, model, outputs, inputs="global", training=PLAIN, boundary=None):
        if outputs not in ("replicate", "local", "dtensor"):
            raise ValueError(f"outputs must be 'replicate', 'local' or 'dtensor', not {outputs!r}")
        self.graph, self.mesh, self.model, self.outputs, self.boundary = graph, mesh, model, outputs, boundary or Boundary()
        self.shape = tuple(mesh.shape)
        self.coord = mesh.get_coordinate() or [0] * mesh.ndim
        self.device = rank_device(mesh)  # where the tensors the model makes are made (devices.py)
        self.layouts = {n.name: node_layout(n, assignment.get(n.name), self.shape) for n in graph.nodes}
        self.layouts = ring_layouts(graph, self.layouts) if training.ring else self.layouts  # K/V kept in chunks
        self.uneven = with_uneven_batch(graph, self.layouts, mesh)  # a batch the degree does not divide
        self.src = graph.fx_graph
        self.values = traced_values(graph, model)
        self.state_of = state_names(graph)
        self.new, self.root = fx.Graph(), nn.Module()
        self.env: dict[fx.Node, _Value] = {}
        self.stored: dict[str, Placements] = {}
        self.grad_of: dict[str, Placements] = {}  # the gradient layout every read must give back
        self.state_nodes: dict[str, fx.Node] = {}
        self.inputs, self.input_specs = [], {}  # the user's input names in order; name -> TensorSpec
        self.sync_bn: set[str] = set()
        self.canonical = aliases(model)  # a tied tensor has several names: one placeholder
        self._stored_placements()
        self.local_inputs = inputs == "local"
        self.input_layout = self._data_axes_of_inputs()
        self.input_placements: dict[str, Placements] = {}
        self.training = training
        self.float_inputs: list[fx.Node] = []  # cast to the compute dtype under mixed precision
        self.made_by: dict[fx.Node, Node] = {}  # a program node -> the IR node it computes
        self.writes = Writes()  # the tensors in-place calls wrote into (inplace.py)
        self.order = {n: i for i, n in enumerate(self.src.graph.nodes)}
        self._node_of = lambda v: self.env[v].node if v in self.env else None  # traced node -> program node

    # -- state ----------------------------------------------------------------------------------
    def _stored_placements(self) -> None:
        """Each parameter is stored as its first reader wants it; later readers reshard."""
        for node in self.graph.nodes:
            lay = self.layouts[node.name]
            for op, pl, g in zip(node.params, lay.params, lay.param_grads):
                name = self.canonical.get(op.source.removeprefix("param:"), op.source.removeprefix("param:"))
                if name not in self.stored:
                    self.stored[name], self.grad_of[name] = pl, g

    def _data_axes_of_inputs(self) -> dict[str, Placements]:
        """Per user input: sharded on its first axis (the batch) over the mesh axes where its
        first reader shards that axis, replicated elsewhere: the slice a rank loads itself."""
        out: dict[str, Placements] = {}
        for node in self.graph.nodes:
            for op, pl in zip(node.inputs, self.layouts[node.name].inputs):
                if op.source.startswith("input:") and op.source[6:] not in out:
                    out[op.source[6:]] = tuple(p if isinstance(p, Shard) and p.dim == 0 else Replicate()
                                               for p in pl)
        return out

    def _state(self, name: str) -> fx.Node:
        name = self.canonical.get(name, name)
        if name not in self.state_nodes:
            with self.new.inserting_before(self._first_input()):
                self.state_nodes[name] = self.new.placeholder("s_" + name.replace(".", "_"))
            self.stored.setdefault(name, self._replicated())
            self.grad_of.setdefault(name, self.stored[name])
        return self.state_nodes[name]

    def _floating_parameters(self) -> list[fx.Node]:
        out = []
        for name, ph in self.state_nodes.items():
            try:
                t = self.model.get_parameter(name)
            except AttributeError:
                continue  # a buffer: kept as it is (running statistics stay fp32)
            if t.is_floating_point():
                out.append(ph)
        return out

    def _first_input(self):
        return next((n for n in self.new.nodes if n.op == "placeholder" and n.name.startswith("x_")),
                    None) or next(iter(self.new.nodes), None)

    def _replicated(self) -> Placements:
        return tuple(Replicate() for _ in self.shape)

    # -- the walk --------------------------------------------------------------------------------
    def run(self) -> Program:
        block = None  # the recomputed block the walk is in (nodes that are no IR node stay in it)
        for n in self.src.graph.nodes:
            mark = self.new._root.prev
            if n.name in self.layouts:
                block = self.training.tag_of(n.name, self.graph.node(n.name).module)
            elif n.op == "output":
                block = None
            if n.op == "placeholder":
                self._placeholder(n)
            elif n.op == "get_attr":
                self._get_attr(n)
            elif n.op == "output":
                self._output(n)
            elif n.name in self.layouts:
                self._ir_node(n, self.graph.node(n.name))
            else:
                self._other(n)
            if n.op != "placeholder":
                tag_new_nodes(self.new, mark, block)
        if self.training.dtype is not None:
            cast_placeholders(self.new, self._floating_parameters(), self.float_inputs, self.training)
        module = fx.GraphModule(self.root, self.new, class_name="RankProgram")
        hoist_counts(module.graph)
        module.graph.eliminate_dead_code(is_impure_node=lambda n: n.is_impure() or n.meta.get(IN_PLACE, False))
        stored, held = own_weights(self.root, module.graph, self.state_nodes, self.stored, self._replicated())
        module.recompile()
        state = [n.name for n in module.graph.nodes if n.op == "placeholder" and n.name.startswith("s_")]
        by_node = {v.name: k for k, v in self.state_nodes.items()}
        names = [by_node[s] for s in state]
        reduce_axes = {k: tuple(a for a, p in enumerate(self.grad_of[k]) if p.is_partial())
                       for k in names if k not in self.sync_bn}
        module = recompute_blocks(module, self.training.pointwise)
        return Program(module, names, self.inputs, self.input_specs, stored,
                       reduce_axes, self.sync_bn, self.layouts, self.output_placements, self.input_placements,
                       [m for m in module.modules() if isinstance(m, OutputReshard)], self.boundary, held)

    def _placeholder(self, n: fx.Node) -> None:
        if n.name in self.state_of and is_state(self.model, self.state_of[n.name]):
            name = self.canonical.get(self.state_of[n.name], self.state_of[n.name])
            self.env[n] = _Value(self._state(name), self.stored.get(name, self._replicated()))
            return
        if n.name in self.state_of:  # a tensor constant torch.export lifted out of the code
            const = getattr(self.graph, "program", None)
            value = const.constants.get(self.state_of[n.name]) if const is not None else None
            if not isinstance(value, torch.Tensor):
                raise LayoutError(f"{n.name}: the exported constant {self.state_of[n.name]!r} is not available")
            name = free_name(self.root, "c_" + n.name)
            self.root.register_buffer(name, constant_on(value, self.device), persistent=False)
            self.env[n] = _Value(self.new.get_attr(name), self._replicated())
            return
        ph = self.new.placeholder("x_" + n.name)
        self.inputs.append(n.name)
        if n.name in self.graph.inputs:
            self.input_specs[n.name] = self.graph.inputs[n.name]
        if not isinstance(self.values.get(n), torch.Tensor):
            self.env[n] = _Value(ph, None)
            return
        if self.values[n].is_floating_point():
            self.float_inputs.append(ph)
        pl = self.boundary.inputs.get(n.name, self._replicated())  # a stage's received shard, or whole
        if self.local_inputs and n.name not in self.boundary.inputs:  # each rank its slice of the batch
            pl = self.input_layout.get(n.name, pl)
            self.input_placements[n.name] = pl
        self.env[n] = _Value(ph, pl)

    def _get_attr(self, n: fx.Node) -> None:
        v = self.values.get(n)
        if isinstance(v, torch.Tensor) and is_state(self.model, n.target):
            name = self.canonical.get(n.target, n.target)
            self.env[n] = _Value(self._state(name), self.stored.get(name, self._replicated()))
        else:  # a constant the tracer stored on its GraphModule
            const = getattr(self.src, n.target)
            name = "c_" + n.target.replace(".", "_")
            if isinstance(const, torch.Tensor):
                self.root.register_buffer(name, constant_on(const, self.device), persistent=False)
            else:
                setattr(self.root, name, const)
            self.env[n] = _Value(self.new.get_attr(name), self._replicated() if isinstance(const, torch.Tensor) else None)

    def _output(self, n: fx.Node) -> None:
        placements = []

        def leave(a):
            if not isinstance(a, fx.Node):
                placements.append(None)
                return a
            v = self.env[a]
            if not is_pl(v.placements):
                placements.append(None)
                return v.node
            if self.boundary.outputs is not None:  # a stage's send: its shard in the plan's layout
                return self._reshard(v, self.boundary.send(placements))
            if self.outputs == "replicate":
                placements.append(self._replicated())
                leaf = len(placements) - 1
                return self._reshard(v, Use(self._replicated(), self._replicated()),
                                     kind=lambda spec: OutputReshard(spec, leaf))
            placements.append(v.placements)
            return v.node

        self.new.output(fx.node.map_arg(n.args[0], leave))
        self.output_placements = placements

    def _other(self, n: fx.Node) -> None:
        """An fx node that is no IR node: a traced constant (a size), an index into a node's tuple
        output, or a tensor op the IR left out (run on whole tensors unless it passes one through)."""
        value = self.values.get(n)
        if not has_tensor(value):
            self.env[n] = _Value(on_device(concrete(value), self.device))
            return
        if (n.op == "call_function" and n.target is operator.getitem and isinstance(n.args[0], fx.Node)
                and not isinstance(self.values.get(n.args[0]), torch.Tensor)):  # an item of a tuple
            src = self.env[n.args[0]]
            idx = n.args[1]
            pl = src.placements[idx] if isinstance(src.placements, (list, tuple)) and not is_pl(src.placements) \
                else src.placements
            self.env[n] = _Value(self.new.call_function(operator.getitem, (src.node, idx)), pl)
            return
        if written_argument(n) is not None and self.writes.rewrites(n, written_argument(n)):
            self.env[n] = self.env[n.args[1]]
            return
        tensors = [a for a in n.all_input_nodes if is_pl(self.env[a].placements)]
        if len(tensors) == 1 and isinstance(value, torch.Tensor):
            pl = self.env[tensors[0]].placements  # a pass-through (contiguous, clone, to, detach)
        else:
            pl = self._replicated()
        args = makes_on_device(n, *pytree.tree_map(lambda a: self._arg_whole(a, len(tensors) != 1), (n.args, n.kwargs)),
                               self.device)
        new = self.new.create_node(n.op, n.target, args[0], args[1], name=n.name)
        self.env[n] = _Value(new, pl if isinstance(value, torch.Tensor) else None)
        if isinstance(value, torch.Tensor) and written_argument(n) is not None:  # run in place on what it reads
            new.meta[IN_PLACE] = through_storage(n, written_argument(n), self.writes, self.order, self._node_of,
                                                 new.args[0])
            self._written(n, written_argument(n))

    def _arg_whole(self, a, whole: bool):
        if not isinstance(a, fx.Node):
            return a
        v = self.env[a]
        if whole and is_pl(v.placements):
            return self._reshard(v, Use(self._replicated(), self._replicated()))
        return v.node

    # -- IR nodes --------------------------------------------------------------------------------
    def _ir_node(self, n: fx.Node, node: Node) -> None:
        layout = self.layouts[node.name]
        module = self.model.get_submodule(n.target) if n.op == "call_module" else None
        if needs_sync(node, layout, module):
            self._sync_bn(n, node, layout, module)
            return
        if needs_sync_op(n, node, layout):
            self._sync_bn_op(n, node, layout)
            return
        # sizes and other non-tensor values become the traced constants, wherever they are nested
        # (a slice's bound, a shape list); tensors stay nodes and become the call's arguments
        bound = makes_on_device(n, *fx.node.map_arg((n.args, n.kwargs), self._constant_unless_tensor), self.device)
        flat, spec = pytree.tree_flatten(bound)
        operands = OperandMatcher(node, layout)
        metadata = set(node.attrs.get(METADATA_READS, ()))
        consts, slots, args, uses = list(flat), [], [], []
        for i, a in enumerate(flat):
            if not isinstance(a, fx.Node):
                continue
            v = self.env[a]
            key = operand_key(a, self.layouts, self.state_of)
            as_is = key is not NO_KEY and (key.source, key.output) in metadata  # x.type_as(y)'s y: any layout
            use = Use(v.placements, v.placements) if as_is else operands.match(key, self.values[a].ndim)
            param = key.source[6:] if key is not NO_KEY and key.source.startswith("param:") else None
            slots.append(i)
            param = self.canonical.get(param, param) if param is not None else None
            args.append(v.node if as_is else self._reshard(v, use, param=param if param in self.stored else None))
            uses.append(use)
            consts[i] = None
        names = []
        if module is not None:
            for name, _ in list(module.named_parameters()) + list(module.named_buffers()):
                qualified = f"{n.target}.{name}" if n.target else name
                use = operands.param(qualified)
                names.append(name)
                canon = self.canonical.get(qualified, qualified)
                args.append(self._reshard(_Value(self._state(qualified), self.stored[canon]), use, param=canon))
                uses.append(use)
        if runs_experts(node):  # its local experts and their token exchange (experts.py)
            name = free_name(self.root, n.name)
            self.root.add_module(name, call := experts_module(self.model, n, node, layout, self.mesh))
            self.made_by[out := self.new.call_module(name, tuple(call.local_args(args)))] = node
            self.env[n] = _Value(out, layout.outputs[0])
            return
        index = lambda dim, lay=layout: chunk_index(dim, lay.axis_dims, self.shape, self.coord)
        written = written_argument(n, module)
        in_place = written is not None and through_storage(n, written, self.writes, self.order, self._node_of,
                                                           args[0] if args else None)
        drop = {j for j, u in enumerate(uses) if any(self.coord[a] != 0 for a in u.additive)}
        counted = counted_mean(node, layout, self.mesh)  # the local mean, scaled by its count (counted.py)
        scale = 1.0 if counted else mean_scale(n, node, layout)
        call = LocalCall(n, node, layout, module, consts, spec, slots, names, scale, drop,
                         vocab_shard(node, layout, self.shape, self.coord), causal_rows(node, layout, index),
                         [(u.spec, u.strided) for u in uses], index, writes_first=written is not None and not in_place,
                         whole_dropout=whole_dropout(n, node, layout, module), groups=local_groups(node, layout),
                         balance=balance_of(node, layout, self.mesh, index, self.training.ring))
        out = inline_call(self.new, call, uses, args)
        if in_place and out is None:
            raise LayoutError(refusal(n, aliasing(n, self.writes.group(n, written), self.order), " (with a repair)"))
        if out is None:
            label = f"{describe(n)}; split {split_words(node, layout)}"
            name = free_name(self.root, n.name)
            self.root.add_module(name, NodeCall(call, label))
            out = self.new.call_module(name, tuple(args))
        if counted is not None:
            out = add_count(self.new, self.root, f"{n.name}_count", counted, *count_operands(call, args, names), out)
        self.made_by[out] = node
        out.meta[IN_PLACE] = in_place  # True: its effect is on other tensors' storage, kept unread
        self.env[n] = _Value(out, self._output_placements(n, layout))
        if written is not None:
            self._written(n, written)

    def _written(self, n: fx.Node, written: fx.Node) -> None:
        """Later readers of the tensor ``n`` wrote into see the new value; a parameter or buffer
        also keeps it, copied into its storage in its stored layout (``inplace.py``)."""
        group = self.writes.record(n, written)
        for k in group:
            self.env[k] = self.env[n]
        root = group[0]
        name = root.target if root.op == "get_attr" else self.state_of.get(root.name) if root.op == "placeholder" else None
        if name is None or not is_state(self.model, name):
            return
        name, v = self.canonical.get(name, name), self.env[n]
        detached = _Value(self.new.call_method("detach", (v.node,)), v.placements)
        value = self._reshard(detached, Use(self.stored[name], self.stored[name]))
        self.new.call_function(write_state, (self._state(name), value)).meta[STATE_WRITE] = True

    def _constant_unless_tensor(self, a: fx.Node):
        v = self.env[a]
        if is_pl(v.placements):
            return a
        return concrete(v.node if not isinstance(v.node, fx.Node) else self.values.get(a))

    def _output_placements(self, n: fx.Node, layout: NodeLayout):
        value = self.values.get(n)
        leaves, spec = pytree.tree_flatten(value)
        outs = iter(layout.outputs)
        pl = [next(outs) if isinstance(t, torch.Tensor) else None for t in leaves]
        return pytree.tree_unflatten(pl, spec) if not isinstance(value, torch.Tensor) else pl[0]

    def _sync_bn(self, n, node, layout, module) -> None:
        x = self.env[n.args[0]]
        use = Use(layout.inputs[0], layout.input_grads[0])
        owner = [self.model.get_submodule(n.target)]
        name = free_name(self.root, n.name)
        self.root.add_module(name, SyncBatchNorm(owner, node, layout, self.mesh))
        for pname, _ in module.named_parameters():
            q = f"{n.target}.{pname}"
            self.sync_bn.add(self.canonical.get(q, q))
        self.env[n] = _Value(self.new.call_module(name, (self._reshard(x, use),)), layout.outputs[0])

    def _sync_bn_op(self, n, node, layout) -> None:
        """``aten.batch_norm`` (input, weight, bias, running_mean, running_var, training, momentum,
        eps, cudnn) with its batch split: global statistics (``batchnorm.sync_batch_norm_local``)."""
        operands = OperandMatcher(node, layout)
        tensors = []
        for a in list(n.args[:5]):
            if not isinstance(a, fx.Node):
                tensors.append(a)
                continue
            key = operand_key(a, self.layouts, self.state_of)
            use = operands.match(key, self.values[a].ndim)
            param = key.source[6:] if key is not NO_KEY and key.source.startswith("param:") else None
            param = self.canonical.get(param, param) if param is not None else None
            tensors.append(self._reshard(self.env[a], use, param=param if param in self.stored else None))
        momentum = float(n.args[6] if len(n.args) > 6 else n.kwargs.get("momentum", 0.1))
        eps = float(n.args[7] if len(n.args) > 7 else n.kwargs.get("eps", 1e-5))
        name = free_name(self.root, n.name)
        self.root.add_module(name, SyncBatchNormOp(node, layout, self.mesh, momentum, eps))
        self.env[n] = _Value(self.new.call_module(name, tuple(tensors)), layout.outputs[0])

    def _reshard(self, v: _Value, use: Use, param: str | None = None, kind=Reshard) -> fx.Node:
        """``v`` in the layout ``use`` wants, its gradient given back as its producer wants it
        (for a parameter: as its first reader's gradient, so that reads add up)."""
        if param is not None:
            param = self.canonical.get(param, param)
        back = self.grad_of[param] if param is not None else grad_target(v.placements)
        if param is None:  # a weight view's partial gradient goes on to its weight's bucket
            weight = lifted_weight(self.made_by.get(v.node), v.placements, use.placements, use.grads,
                                   self.grad_of, self.canonical, self.model)
            if weight is not None:
                self.grad_of[weight] = back = use.grads
        spec = ReshardSpec(self.mesh, v.placements, use.placements, use.grads, back)
        if not needs_reshard(spec):
            return v.node
        if self.uneven is not None:  # DTensor moves uneven shards given the whole shape
            spec = self.uneven.spec(spec, v.node, self.env, self.values)
        name = f"reshard_{len([m for m in self.root.children() if isinstance(m, Reshard)])}"
        self.root.add_module(name, kind(spec))
        return self.new.call_module(name, (v.node,))


__all__ = ["Program", "build", "NodeCall", "LayoutError"]
