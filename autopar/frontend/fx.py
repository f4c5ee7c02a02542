"""Front end 1: torch.fx ``symbolic_trace`` + meta-tensor shape propagation.

Buffers are proxied and modules with a rule kept as leaves; shapes come from running the traced
graph on meta tensors: parameters, buffers and inputs are swapped for meta copies of their
metadata, so neither a meta model nor a real CPU model has its weights allocated, copied or read,
and the model's real forward never runs. Keyword inputs bind to forward's parameters by name;
parameters the call leaves out keep their defaults (fx ``concrete_args``).
"""

from __future__ import annotations

import contextlib
import inspect
import re
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import fx, nn

from autopar.core.call import CallSpec, InputLeaf, output_path
from autopar.core.ir import Graph
from autopar.core.meta import MetaProp, to_meta
from autopar.core.weight_views import mark_weight_views
from autopar.frontend.build import Builder, bind, output_leaves, tensor
from autopar.frontend.cycles import Proxy, release_tracer, weak_owner
from autopar.frontend.failures import Failure, stack_line, user_frame
from autopar.frontend.inputs import ExampleCall, bound_arguments
from autopar.frontend.pristine import unchanged
from autopar.frontend.rules.sites import ATTRIBUTES, FUNCTIONS, METHODS, has_module_rule, module_call

# front end 1: torch.fx symbolic_trace + meta-tensor shape propagation


class _Tracer(fx.Tracer):
    """Proxies buffers too (``self.mask[:s]``), and keeps exactly the modules with a rule as leaves."""

    proxy_buffer_attributes = True

    def __init__(self, stack_traces: bool = False) -> None:
        super().__init__()
        self.record_stack_traces = stack_traces  # costly; only re-traced with them to locate an error

    def is_leaf_module(self, m: nn.Module, qualified_name: str) -> bool:
        return has_module_rule(m)

    def call_module(self, m: nn.Module, forward, args, kwargs):
        plain = _plain_encoder(m, args, kwargs)
        return super().call_module(m, plain or forward, args, kwargs)

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return Proxy(node, self)  # torch's own keeps the stack's frames alive (frontend/cycles.py)


# torch's factories take sizes, not tensors, so fx cannot intercept them: ``torch.zeros(x.shape[0],
# 16)`` reached the real function with a Proxy and failed. While tracing they are wrapped: a call
# with a Proxy anywhere in its arguments becomes a graph node for the real function.
_FACTORIES = ("zeros", "ones", "full", "empty", "arange", "rand", "randn", "randint", "eye", "linspace")


@contextlib.contextmanager
def _traceable_factories():
    originals = {name: getattr(torch, name) for name in _FACTORIES}

    def wrap(fn):
        def factory(*args, **kwargs):
            for a in torch.utils._pytree.tree_leaves((args, kwargs)):
                if isinstance(a, fx.Proxy):
                    return a.tracer.create_proxy("call_function", fn, args, kwargs)
            return fn(*args, **kwargs)
        return factory

    try:
        for name, fn in originals.items():
            setattr(torch, name, wrap(fn))
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch, name, fn)


def _plain_encoder(m: nn.Module, args: tuple, kwargs: dict):
    """nn.TransformerEncoder's forward without its fast-path tests, where they change nothing.

    Its forward asks ``src.is_nested`` (a tensor test fx cannot trace) even when no fused kernel
    can run. Without masks (and not causal), it is its layers in turn, then its norm: what this
    traces instead. With masks, the module's own forward runs (and torch.export takes over)."""
    if not isinstance(m, nn.TransformerEncoder):
        return None
    names = ("src", "mask", "src_key_padding_mask", "is_causal")
    bound = dict(zip(names, args), **kwargs)
    if bound.get("mask") is not None or bound.get("src_key_padding_mask") is not None or bound.get("is_causal"):
        return None

    def forward(src, *_, **__):
        out = src
        for layer in m.layers:
            out = layer(out, src_mask=None, is_causal=False, src_key_padding_mask=None)
        return m.norm(out) if m.norm is not None else out

    return forward


class FxFrontend(Builder):
    frontend = "torch.fx"

    def __init__(self, model: nn.Module, call: ExampleCall) -> None:
        super().__init__(model)
        self.call = call
        self.values: dict[fx.Node, Any] = {}
        bound = bound_arguments(model, call)
        self.bound = bound if bound is not None else {f"arg{i}": a for i, a in enumerate(call.args)}

    def graph(self) -> Graph:
        nested = [p for p, _ in self.call.tensors() if not re.fullmatch(r"args\[\d+\]|\w+", p)]
        if nested:  # a placeholder holds a whole argument: nested tensors are torch.export's to flatten
            raise Failure(self.frontend, ValueError(f"tensors inside a structured input ({nested[0]})"))
        gm = self._trace()
        try:
            self._propagate(gm)
        except Failure:  # trace again with source lines, so that the message can point at one
            gm = self._trace(stack_traces=True)
            self._propagate(gm)
        out_node = None
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                self.add_input(node, node.name)
            elif node.op == "get_attr":
                v = self.values[node]
                self.env[node] = tensor(v, f"param:{node.target}") if isinstance(v, torch.Tensor) else v
            elif node.op == "output":
                out_node = node
            else:
                self.add_call(node)
        value = _plain(self.resolve(out_node.args[0]))
        flat, out_spec = pytree.tree_flatten_with_path(value)
        outputs, out_leaves = output_leaves([(output_path(p), v) for p, v in flat])
        gm.meta["autopar_frontend"] = "fx"
        # the Python values the call gave non-tensor parameters (``scale=0.5``): the graph is traced
        # with them, and a propagation again (codegen's) must feed them, not None
        gm.meta["autopar_constants"] = {n.name: self.values.get(n) for n in gm.graph.nodes
                                        if n.op == "placeholder" and not isinstance(self.values.get(n), torch.Tensor)}
        self.nodes = mark_weight_views(self.nodes, outputs)
        graph = Graph(self.nodes, self.inputs, outputs, type(self.model).__name__, gm, frontend="fx")
        leaves = self._input_leaves(gm)
        graph.call = CallSpec(pytree.tree_structure((self.call.args, self.call.kwargs)), leaves, out_spec,
                              out_leaves, *self._batch(leaves), training=self.model.training)
        return graph

    def _input_leaves(self, gm: fx.GraphModule) -> tuple[InputLeaf, ...]:
        """Each leaf of the call, as the placeholder of the forward parameter it is."""
        params = self._params()
        names = dict(zip(params, (n.name for n in gm.graph.nodes if n.op == "placeholder")))
        leaves = []
        for path, v in self.call.leaves():
            param = path
            if path.startswith("args[") and path.endswith("]") and path[5:-1].isdigit():
                i = int(path[5:-1])
                param = params[i] if i < len(params) else path
            name = names.get(param, "")
            if isinstance(v, torch.Tensor) and name in self.inputs:
                leaves.append(InputLeaf(path, placeholder=name))
            else:
                leaves.append(InputLeaf(path, value=v))
        return tuple(leaves)

    def _batch(self, leaves: tuple[InputLeaf, ...]) -> tuple:
        size, paths = self.call.batch()
        return size, tuple(leaf.placeholder for leaf in leaves if leaf.path in paths and leaf.placeholder)

    def _params(self) -> list[str]:
        try:
            return list(inspect.signature(self.model.forward).parameters)
        except (TypeError, ValueError):
            return list(self.bound)

    def _trace(self, stack_traces: bool = False) -> fx.GraphModule:
        try:
            params = list(inspect.signature(self.model.forward).parameters.values())
        except (TypeError, ValueError):
            params = []
        keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        given = set(self.call.kwargs) | {p.name for p in params[:len(self.call.args)]}
        concrete = {p.name: p.default for p in params
                    if p.name not in given and p.default is not inspect.Parameter.empty and p.kind in keyword}
        tracer = _Tracer(stack_traces)
        # fx stores tensors made while tracing (``torch.arange(4)`` in an index) as attributes
        # ``_tensor_constant<i>`` of the traced module: of the user's model. The GraphModule keeps
        # its own reference; take them off the model again, so that tracing leaves it as it was
        # and a second trace names its constants (and fingerprints) the same.
        before = set(vars(self.model))
        # nn.TransformerEncoder(Layer) test tensors (src.dim(), src.is_nested) to pick a fused
        # inference kernel, unless that fast path is off: off while tracing, the test is skipped
        # and they trace as the modules they are made of (the fast path gives the same values)
        fastpath = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            with _traceable_factories(), unchanged(self.model) as state:
                graph = tracer.trace(self.model, concrete_args=concrete or None)
                assigned = state.assigned()
                if assigned:  # the graph would read the traced value and never write it back
                    raise ValueError(f"forward() assigns to {', '.join(assigned)} (`self."
                                     f"{assigned[0].rpartition('.')[2]} += ...` or `= ...`), an update torch.fx "
                                     "cannot record: write it in place (`.add_(...)`, `.copy_(...)`)")
                return weak_owner(fx.GraphModule(tracer.root, graph, type(self.model).__name__))  # takes the constants
        except Exception as e:
            module, where = user_frame(e, self.model)
            raise Failure(self.frontend, e, module, where, "trace") from e
        finally:
            release_tracer(tracer)
            torch.backends.mha.set_fastpath_enabled(fastpath)
            for name in set(vars(self.model)) - before:
                delattr(self.model, name)

    def _propagate(self, gm: fx.GraphModule) -> None:
        interp = MetaProp(gm)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        # placeholders follow forward's parameters in order; those the call leaves out keep defaults
        args = [to_meta(self.bound.get(p)) for p, _ in zip(self._params(), placeholders)]
        args += [None] * (len(placeholders) - len(args))
        try:
            with torch.no_grad(), torch.device("meta"):
                interp.run(*args)
        except Exception as e:
            node = _failing_node(interp)
            module = self.module_of(node) if node is not None and node.op != "call_module" else \
                (node.target if node is not None else "")
            raise Failure(self.frontend, e, module, stack_line(node), "shapes") from e
        self.values = interp.values

    def value(self, node: fx.Node) -> Any:
        return self.values.get(node)

    def site(self, node: fx.Node, args: tuple, kwargs: dict):
        if node.op == "call_module":
            m = self.model.get_submodule(node.target)

            def param(name: str):  # the module's own parameter or buffer; "out_proj.weight" too
                t = m
                for part in name.split("."):
                    t = getattr(t, part, None)
                return tensor(t, f"param:{node.target}.{name}") if isinstance(t, torch.Tensor) else None

            mc = module_call(m, list(args), dict(kwargs), param)
            return (mc.site, mc.args) if mc is not None else None
        if node.op == "call_method":
            site = METHODS.get(node.target)
        elif node.target is getattr:
            site, args = ATTRIBUTES.get(args[1]), args[:1]
        else:
            site = FUNCTIONS.get(node.target)
        return bind(site, args, kwargs) if site is not None else None


def _plain(value: Any) -> Any:
    """fx's immutable_list/immutable_dict as the list/dict the model built (tuples keep their type)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_plain(v) for v in value)
    return value


def _failing_node(interp: MetaProp) -> fx.Node | None:
    """fx.Interpreter runs nodes in order, so the failing node is the first without a value."""
    for n in interp.graph.nodes:
        if n not in interp.values:
            return n
    return None
