"""Front end 2: ``torch.export.export`` (the training IR: aten ops, not decomposed).

Its nodes map onto the same rules as fx's through ``rules.sites.ATEN``; export runs on fake
tensors, so it copies and reads no weights. Three things make it take the models people train:

* Outputs: a forward hook, there only while exporting, flattens what the model returns with
  torch's pytree and hands export the tensor leaves. A leaf pytree cannot see into (transformers'
  ``DynamicCache`` from a default-config GPT-2 or Llama, any custom object) is left out and
  recorded as dropped, so it never makes tracing fail; nothing is registered process-wide, and
  the model's own parameter names, buffers and input names stay as they are (no wrapper module).
  ``Graph.call`` rebuilds the model's output type (a ``ModelOutput`` with loss and logits, a
  dict, a tuple) around the graph's outputs, dropped leaves as None.
* Batch: dim 0 of the batched inputs is exported as ``Dim("batch")`` when the example batch is at
  least 2 (torch specializes a size-1 dim), so the program runs for other batch sizes; where the
  model pins it (``view(2, ...)``) export is redone with static shapes and the batch recorded.
* Dead code: nodes no output depends on (the cache's ``cat``s) are left out of the IR, as fx's
  dead-code elimination would; state updates (BatchNorm's ``num_batches_tracked += 1``) too.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import warnings
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import fx, nn

from autopar.core.call import CallSpec, InputLeaf, output_path
from autopar.core.ir import Graph
from autopar.core.weight_views import mark_weight_views
from autopar.frontend.build import Builder, Dropped, bind, concrete, output_leaves, tensor
from autopar.frontend.cycles import collect_after_export
from autopar.frontend.experts import fold_experts
from autopar.frontend.failures import DATA_DEPENDENT, Failure, user_frame
from autopar.frontend.inputs import ExampleCall
from autopar.frontend.rules.base import Tensor
from autopar.frontend.rules.sites import ATEN, FUNCTIONS

_EXPORT_LOGGERS = ("torch._subclasses.fake_tensor", "torch.fx.experimental.symbolic_shapes", "torch.export",
                   "torch._export", "torch._dynamo")


class ExportFrontend(Builder):
    frontend = "torch.export"

    def __init__(self, model: nn.Module, call: ExampleCall) -> None:
        super().__init__(model)
        self.call = call
        self.out_leaves: list[tuple[str, Any]] = []  # (path, example leaf) as the hook saw them
        self.out_spec: pytree.TreeSpec | None = None
        self.notes: list[str] = []  # about the export (batch); the outputs' own are made by the hook
        self.out_notes: list[str] = []

    def graph(self) -> Graph:
        try:
            ep, dynamic = self._export()
        finally:
            collect_after_export(self.model)  # torch's tracer holds the model in a cycle (frontend/cycles.py)
        sig = ep.graph_signature
        state = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
        gm = ep.graph_module
        self.notes += fold_experts(gm, self.model, state)
        live = _live(gm)
        out_node = None
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                v = node.meta.get("val")
                if node.name in state and isinstance(v, torch.Tensor):
                    self.env[node] = tensor(v, f"param:{state[node.name]}")
                else:
                    self.add_input(node, node.name)
            elif node.op == "output":
                out_node = node
            elif node.op == "call_function":
                if node not in live or _state_update(node, self.env):
                    continue
                self.add_call(node)
            elif node.op == "get_attr":
                self.env[node] = getattr(gm, node.target, None)
        graph_outs = iter(self.resolve(out_node.args[0]))
        leaves = []
        for path, v in self.out_leaves:
            if isinstance(v, torch.Tensor):
                leaves.append((path, next(graph_outs)))
            else:
                leaves.append((path, v if isinstance(v, Dropped) else concrete(v)))
        outputs, out_leaves = output_leaves(leaves)
        gm.meta["autopar_frontend"] = "export"
        gm.meta["autopar_state"] = dict(state)  # placeholder -> parameter/buffer name, for codegen
        gm.meta["autopar_batch_axes"] = _batch_sized_axes(gm, self.nodes)  # for core.batch
        self.nodes = mark_weight_views(self.nodes, outputs)
        graph = Graph(self.nodes, self.inputs, outputs, type(self.model).__name__, gm, frontend="export",
                      program=ep)
        in_leaves = self._input_leaves(sig)
        size, paths = self.call.batch()
        batched = tuple(leaf.placeholder for leaf in in_leaves if leaf.path in paths and leaf.placeholder)
        graph.call = CallSpec(pytree.tree_structure((self.call.args, self.call.kwargs)), in_leaves,
                              self.out_spec, out_leaves, size, batched, dynamic, _batch_range(ep, dynamic),
                              training=self.model.training, notes=self.out_notes + self.notes)
        return graph

    def _input_leaves(self, sig) -> tuple[InputLeaf, ...]:
        """The call's leaves: its tensors are the user-input placeholders, in order; the rest constants."""
        names = iter(s.arg.name for s in sig.input_specs
                     if s.kind.name == "USER_INPUT" and isinstance(s.arg, torch.export.graph_signature.TensorArgument))
        return tuple(InputLeaf(path, placeholder=next(names)) if isinstance(v, torch.Tensor) else InputLeaf(path, value=v)
                     for path, v in self.call.leaves())

    # -- exporting ------------------------------------------------------------------------------

    def _export(self) -> tuple[torch.export.ExportedProgram, bool]:
        """The exported program, batch dynamic where it can be; (program, dynamic)."""
        shapes = self._dynamic_shapes()
        if shapes is not None:
            try:
                return self._run_export(shapes), True
            except Failure as f:
                self.notes.append(f"batch size fixed at {self.call.batch()[0]}: exporting it as a dynamic "
                                  f"dim failed ({f.reason[:160]})")
        return self._run_export(None), False

    def _dynamic_shapes(self) -> dict | None:
        """``{forward parameter: spec}`` with ``{0: Dim("batch")}`` on the batched tensors, or None."""
        size, paths = self.call.batch()
        if size is None or size < 2:
            if size == 1:
                self.notes.append("batch size fixed at 1: torch.export specializes size-1 dims; trace with a "
                                  "batch of at least 2 for a graph that takes any batch size")
            return None
        try:
            bound = inspect.signature(self.model.forward).bind(*self.call.args, **self.call.kwargs)
        except (TypeError, ValueError):
            return None
        batch = torch.export.Dim("batch", min=1)
        batched = {id(v) for p, v in self.call.leaves() if p in paths}

        def spec(v):
            return {0: batch} if isinstance(v, torch.Tensor) and id(v) in batched else None

        return {name: pytree.tree_map(spec, value) for name, value in bound.arguments.items()}

    def _run_export(self, dynamic_shapes) -> torch.export.ExportedProgram:
        quiet = [logging.getLogger(n) for n in _EXPORT_LOGGERS]
        levels = [q.level for q in quiet]
        for q in quiet:  # a failed export logs tracebacks and graphs; its exception says it all in one line
            q.setLevel(logging.CRITICAL)
        handle = self.model.register_forward_hook(self._flatten_outputs, with_kwargs=True)
        try:
            with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):  # it prints partial graphs
                warnings.simplefilter("ignore")
                return torch.export.export(self.model, self.call.args, self.call.kwargs,
                                           dynamic_shapes=dynamic_shapes, strict=False)
        except Failure:
            raise
        except Exception as e:
            module, where = user_frame(e, self.model)
            stage = "trace" if any(k in str(e) for k in DATA_DEPENDENT) else "shapes"
            raise Failure(self.frontend, e, module, where, stage) from e
        finally:
            handle.remove()
            for q, level in zip(quiet, levels):
                q.setLevel(level)

    def _flatten_outputs(self, module: nn.Module, args, kwargs, output) -> tuple:
        """Forward hook while exporting: the output's tensor leaves; the structure kept aside."""
        try:
            flat, spec = pytree.tree_flatten_with_path(output)
            leaves = [(output_path(p), v) for p, v in flat]
        except ValueError:  # a pytree node registered without keys: positions then
            flat_values, spec = pytree.tree_flatten(output)
            leaves = [(f"[{i}]", v) for i, v in enumerate(flat_values)]
        self.out_spec, self.out_leaves, self.out_notes = spec, [], []  # each export run sees them afresh
        for path, v in leaves:
            if not isinstance(v, torch.Tensor) and not _is_constant(v):
                v = Dropped(f"a {type(v).__name__}, not a tensor torch's pytree can flatten (such as a "
                            f"generation cache, which a training step does not use); returned as None")
                self.out_notes.append(f"output {path} dropped: {v.reason}")
            self.out_leaves.append((path, v))
        tensors = tuple(v for _, v in self.out_leaves if isinstance(v, torch.Tensor))
        if not tensors:
            raise Failure(self.frontend, ValueError(f"{type(module).__name__} returns no tensor torch's pytree can "
                                                    f"reach (it returned {type(output).__name__})"), stage="outputs")
        return tensors

    # -- rules ----------------------------------------------------------------------------------

    def value(self, node: fx.Node) -> Any:
        return node.meta.get("val")

    def site(self, node: fx.Node, args: tuple, kwargs: dict):
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            site = ATEN.get(target.overloadpacket)
        else:
            site = FUNCTIONS.get(target)
        return bind(site, args, kwargs) if site is not None else None


def _batch_sized_axes(gm: fx.GraphModule, nodes) -> dict[str, list[tuple[int, int]]]:
    """IR node -> its (output, axis) pairs whose traced size is the exported batch symbol.

    A dynamic-batch export traces every size as a symbol, and the batch is one symbol: an axis
    whose size is that symbol has the batch's size, wherever it came from. Batch propagation
    through data inputs (``core.batch``) misses the axes a model builds from the batch's size
    alone, such as a Hugging Face attention mask (``arange(batch)``, an ``expand`` to the batch),
    which a plan then leaves whole on every data-parallel rank. Empty for a static export."""
    batch = None
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if n.op == "placeholder" and isinstance(v, torch.Tensor) and v.dim() and isinstance(v.shape[0], torch.SymInt):
            batch = v.shape[0].node.expr
            break
    if batch is None:
        return {}
    fx_nodes = {n.name: n for n in gm.graph.nodes}
    out: dict[str, list[tuple[int, int]]] = {}
    for node in nodes:
        n = fx_nodes.get(node.name)
        values = [v for v in pytree.tree_leaves(n.meta.get("val")) if isinstance(v, torch.Tensor)] if n is not None else []
        for j, v in enumerate(values[:len(node.outputs)]):
            for i, size in enumerate(v.shape):
                if isinstance(size, torch.SymInt) and size.node.expr == batch:
                    out.setdefault(node.name, []).append((j, i))
    return out


def _is_constant(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str, torch.SymInt, torch.SymFloat, torch.SymBool,
                                       torch.dtype, torch.device))


def _batch_range(ep: torch.export.ExportedProgram, dynamic: bool) -> tuple[int, int | None]:
    if not dynamic:
        return (1, None)
    for r in ep.range_constraints.values():  # one symbol: the batch
        return (max(_bound(r.lower) or 1, 1), _bound(r.upper))
    return (1, None)


def _bound(value) -> int | None:
    """A range bound as an int; None for an infinite one (sympy's oo, torch's int_oo)."""
    text = str(value)
    return int(text) if text.lstrip("-").isdigit() else None


def _live(gm: fx.GraphModule) -> set[fx.Node]:
    """Nodes an output depends on, or that update a placeholder (a buffer, an input) in place."""
    roots = []
    for n in gm.graph.nodes:
        if n.op == "output":
            roots.append(n)
        elif n.op == "call_function" and not n.users and _mutates_placeholder(n):
            roots.append(n)
    live: set[fx.Node] = set()
    while roots:
        n = roots.pop()
        if n in live:
            continue
        live.add(n)
        roots.extend(n.all_input_nodes)
    return live


def _mutates_placeholder(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.is_mutable:
        return False
    first = node.args[0] if node.args else None
    return isinstance(first, fx.Node) and first.op == "placeholder"


def _state_update(node: fx.Node, env: dict) -> bool:
    """An in-place op on a parameter or buffer whose result nobody reads, e.g. BatchNorm's
    ``num_batches_tracked += 1``: bookkeeping, not part of the computation to split."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or node.users:
        return False
    first = env.get(node.args[0]) if node.args and isinstance(node.args[0], fx.Node) else None
    return target.overloadpacket.__name__.endswith("_") and isinstance(first, Tensor) and first.source.startswith("param:")
