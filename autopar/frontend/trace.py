"""``trace(model, example_inputs) -> ir.Graph``: the first stage of the pipeline.

Two front ends share one set of rules (``autopar.frontend.rules``):

1. torch.fx ``symbolic_trace`` (buffers proxied, modules with a rule kept as leaves), then shapes
   propagated on meta tensors: parameters, buffers and inputs are swapped for meta copies of their
   metadata, so neither a meta model nor a real CPU model has its weights allocated, copied or
   read, and the model's real forward never runs.
2. When fx cannot trace the model (Python control flow on shapes, modules it cannot enter):
   ``torch.export.export(strict=False)``, whose aten-level nodes map onto the same rules through
   ``rules.sites.ATEN``. Export runs on fake tensors, so it copies no weights either.

When both fail, a ``TraceError`` names the module, the source line and what to do, in one line.
Shapes are static: ``x.shape``/``x.size(1)`` evaluate to ints and become no node.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import operator
import os
import warnings
import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from autopar.core.errors import TraceError
from autopar.core.meta import MetaProp, to_meta
from autopar.core.ir import Graph, Node, TensorSpec
from autopar.frontend.rules import build_node
from autopar.frontend.rules.base import Call, Tensor, collect_tensors
from autopar.frontend.rules.sites import ATEN, ATTRIBUTES, FUNCTIONS, METHODS, Site, has_module_rule, module_call

_TORCH_DIR = os.path.dirname(torch.__file__)
_AUTOPAR_DIR = os.path.dirname(os.path.abspath(__file__))


def trace(model: nn.Module, example_inputs, *, frontend: str = "auto", progress=None) -> Graph:
    """Trace ``model`` called on ``example_inputs`` into an ``ir.Graph``.

    ``frontend``: "auto" (fx, then torch.export if fx fails), "fx" or "export" (to force one).
    ``progress``: a status line ``"tracing <Model> ... 1.2 s"`` (``autopar.core.progress.phase``):
    None shows it on stderr when stderr is a terminal, a stream shows it there when that stream is
    a terminal, True always (on stderr), False never. Nothing is written off a terminal.
    Raises ``TraceError`` (one actionable line) when the model cannot be traced, ``ValueError``
    when ``example_inputs`` do not fit ``model.forward``'s signature.
    """
    if frontend not in ("auto", "fx", "export"):
        raise ValueError(f"frontend must be 'auto', 'fx' or 'export', not {frontend!r}")
    if not isinstance(model, nn.Module):
        raise TraceError(f"autopar traces a torch.nn.Module (its parameters are what it shards), not a "
                         f"{type(model).__name__}: wrap the computation in an nn.Module")
    inputs = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
    _check_arity(model, inputs)
    from autopar.core.progress import phase

    if progress is None or isinstance(progress, bool):
        stream, enabled = None, progress
    else:
        stream, enabled = progress, None
    with phase(f"tracing {type(model).__name__}", stream=stream, enabled=enabled):
        return _trace(model, inputs, frontend)


def _trace(model: nn.Module, inputs: tuple, frontend: str) -> Graph:
    failures: list[_Failure] = []
    if frontend in ("auto", "fx"):
        try:
            return _FxFrontend(model, inputs).graph()
        except _Failure as f:
            failures.append(f)
    if frontend in ("auto", "export"):
        try:
            return _ExportFrontend(model, inputs).graph()
        except _Failure as f:
            failures.append(f)
    raise TraceError(_message(model, inputs, failures)) from failures[0].cause


# ---------------------------------------------------------------------------------------------
# failures and their one-line messages


@dataclass
class _Failure(Exception):
    """Why one front end gave up, located in the user's code where we can."""

    frontend: str
    cause: BaseException
    module: str = ""
    where: str = ""  # "file.py:12 (`code`)"
    stage: str = "trace"  # "trace" (building the graph) or "shapes" (running it on meta tensors)

    @property
    def reason(self) -> str:
        text = str(self.cause).strip().splitlines()
        first = next((line.strip() for line in text if line.strip()), type(self.cause).__name__)
        return first[:240]


_DATA_DEPENDENT = ("symbolically traced variables cannot be used as inputs to control flow",
                   "data-dependent", "GuardOnDataDependentSymNode", "Could not guard on data-dependent",
                   "Could not extract specialized integer from data-dependent", ".item()")


def _advice(failures: list[_Failure]) -> str:
    text = " ".join(str(f.cause) for f in failures)
    if any(key in text for key in _DATA_DEPENDENT):
        return ("forward() branches on tensor values: express the branch with torch.where or torch.cond, "
                "or compute the condition outside the model")
    if any(f.stage == "shapes" for f in failures):
        return "check that example_inputs have the shapes and dtypes model.forward expects"
    return ("make that line traceable (no Python control flow on tensors or shapes), or move it into a "
            "submodule autopar treats as a leaf")


def _message(model, inputs, failures: list[_Failure]) -> str:
    first = failures[0]
    shapes = ", ".join(str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__ for x in inputs)
    where = f" at {first.where}" if first.where else ""
    module = f" in module '{first.module}'" if first.module else ""
    tried = " and ".join(f.frontend for f in failures)
    parts = [f"cannot trace {type(model).__name__} (inputs {shapes}) with {tried}{module}{where}: {first.reason}"]
    if len(failures) > 1 and failures[1].reason != first.reason:
        parts.append(f"{failures[1].frontend}: {failures[1].reason}")
    parts.append(_advice(failures))
    return "; ".join(p.replace("\n", " ") for p in parts)


def _user_frame(exc: BaseException, model: nn.Module) -> tuple[str, str]:
    """(module path, "file:line (`code`)") of the innermost frame of the user's code in ``exc``."""
    paths = {id(m): name for name, m in model.named_modules()}
    found = ("", "")
    tb = exc.__traceback__
    while tb is not None:
        frame, filename = tb.tb_frame, tb.tb_frame.f_code.co_filename
        if not filename.startswith(_TORCH_DIR) and not filename.startswith(_AUTOPAR_DIR + os.sep + "trace"):
            if not filename.startswith(_AUTOPAR_DIR + os.sep + "rules") and "<" not in filename:
                owner = frame.f_locals.get("self")
                module = paths.get(id(owner), "") if isinstance(owner, nn.Module) else ""
                summary = traceback.extract_tb(tb, limit=1)[0]
                where = f"{os.path.basename(filename)}:{tb.tb_lineno}"
                if summary.line:
                    where += f" (`{summary.line.strip()}`)"
                found = (module or found[0], where)
        tb = tb.tb_next
    return found


def _check_arity(model: nn.Module, inputs: tuple) -> None:
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*inputs)
    except TypeError as e:
        raise ValueError(f"example_inputs do not fit {type(model).__name__}.forward{sig}: {e} "
                         f"(got {len(inputs)} input(s))") from None


# ---------------------------------------------------------------------------------------------
# the part both front ends share: fx nodes with known values -> ir.Nodes


class _Builder:
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
            t = _tensor(v, f"input:{name}")
            self.inputs[name] = TensorSpec(t.shape, t.dtype, ((),) * t.ndim)
            self.env[node] = t
        else:
            self.env[node] = v

    def add_call(self, node: fx.Node) -> None:
        value = self.value(node)
        args, kwargs = self.resolve(node.args), self.resolve(node.kwargs)
        if not _has_tensor(value):  # shapes, sizes and arithmetic on them: constants, no node
            self.env[node] = _concrete(value)
            return
        if node.target is getattr and isinstance(args[0], Tensor) and args[1] not in ATTRIBUTES:
            self.env[node] = _concrete(value)
            return
        if node.target is operator.getitem and isinstance(args[0], (list, tuple)):
            self.env[node] = args[0][args[1]]  # one output of a multi-output node: Operand(output=j)
            return
        found = self.site(node, args, kwargs)
        outs = tuple(_tensor(t) for t in _flat_tensors(value))
        if found is None:
            site, bound = _opaque_site(node, self.target_name(node)), {"args": args, "kwargs": kwargs}
        else:
            site, bound = found
        if not _flat_tensors((list(args), kwargs)):  # torch.ones(T, T), arange...
            site = _opaque_site(node, site.target, "creates a new tensor (factory op); replicated")
            bound = {"args": args, "kwargs": kwargs}
        call = Call(site.op, site.target, bound, outs, dict(site.fixed))
        module = node.target if node.op == "call_module" else self.module_of(node)
        self.nodes.append(build_node(node.name, module, call))
        self.env[node] = _relabel(value, node.name, iter(range(len(outs))))

    def target_name(self, node: fx.Node) -> str:
        if node.op == "call_method":
            return f"Tensor.{node.target}"
        if node.op == "call_module":
            return f"torch.nn.{type(self.model.get_submodule(node.target)).__name__}"
        t = node.target
        return str(t) if isinstance(t, torch._ops.OpOverload) else f"{getattr(t, '__module__', '')}.{getattr(t, '__name__', t)}"

    def outputs_of(self, node: fx.Node) -> list[tuple[str, int]]:
        found: list[Tensor] = []
        _collect_tensors(self.resolve(node.args), found)
        return [(t.source, t.output) for t in found]


def _opaque_site(node: fx.Node, target: str, reason: str = "") -> Site:
    from autopar.frontend.rules.base import signature

    return Site("opaque", signature("*args, **kwargs"), target,
                {"reason": reason or f"no split rule for {target}; replicated"})


def _bind(site: Site, args: tuple, kwargs: dict, node: fx.Node) -> tuple[Site, dict]:
    try:
        return site, site.bind(args, kwargs)
    except TypeError as e:
        return _opaque_site(node, site.target, f"unexpected arguments for {site.target}: {e}"), \
            {"args": args, "kwargs": kwargs}


def _tensor(t: torch.Tensor, source: str = "", output: int = 0) -> Tensor:
    return Tensor(tuple(int(s) for s in t.shape), str(t.dtype).replace("torch.", ""), source, output)


def _has_tensor(v: Any) -> bool:
    return bool(_flat_tensors(v))


def _flat_tensors(v: Any) -> list:
    found: list = []
    _collect_tensors(v, found)
    return found


def _collect_tensors(v: Any, found: list) -> None:
    collect_tensors(v, found, (torch.Tensor, Tensor))


def _relabel(value: Any, name: str, counter) -> Any:
    """The node's result with every tensor replaced by its Operand-like ``Tensor(name, j)``."""
    if isinstance(value, torch.Tensor):
        return _tensor(value, name, next(counter))
    if isinstance(value, (list, tuple)):
        items = [_relabel(v, name, counter) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    return value


def _concrete(v: Any) -> Any:
    """torch.Size and SymInts as plain Python ints/tuples, so rules only see static numbers."""
    if isinstance(v, torch.Size):
        return tuple(int(s) for s in v)
    if isinstance(v, torch.SymInt):
        return int(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_concrete(x) for x in v) if not hasattr(v, "_fields") else v
    return v


# ---------------------------------------------------------------------------------------------
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


class _FxFrontend(_Builder):
    frontend = "torch.fx"

    def __init__(self, model: nn.Module, inputs: tuple) -> None:
        super().__init__(model)
        self.inputs_given = inputs
        self.values: dict[fx.Node, Any] = {}

    def graph(self) -> Graph:
        gm = self._trace()
        try:
            self._propagate(gm)
        except _Failure:  # trace again with source lines, so that the message can point at one
            gm = self._trace(stack_traces=True)
            self._propagate(gm)
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                self.add_input(node, node.name)
            elif node.op == "get_attr":
                v = self.values[node]
                self.env[node] = _tensor(v, f"param:{node.target}") if isinstance(v, torch.Tensor) else v
            elif node.op == "output":
                outputs = self.outputs_of(node)
            else:
                self.add_call(node)
        return Graph(self.nodes, self.inputs, outputs, type(self.model).__name__, gm)

    def _trace(self, stack_traces: bool = False) -> fx.GraphModule:
        params = list(inspect.signature(self.model.forward).parameters.values())
        concrete = {p.name: p.default for p in params[len(self.inputs_given):]
                    if p.default is not inspect.Parameter.empty and p.kind == p.POSITIONAL_OR_KEYWORD}
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
            with _traceable_factories():
                graph = tracer.trace(self.model, concrete_args=concrete or None)
            return fx.GraphModule(tracer.root, graph, type(self.model).__name__)
        except Exception as e:
            module, where = _user_frame(e, self.model)
            raise _Failure(self.frontend, e, module, where, "trace") from e
        finally:
            torch.backends.mha.set_fastpath_enabled(fastpath)
            for name in set(vars(self.model)) - before:
                delattr(self.model, name)

    def _propagate(self, gm: fx.GraphModule) -> None:
        interp = MetaProp(gm)
        args = [to_meta(x) for x in self.inputs_given]
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        args += [None] * (len(placeholders) - len(args))  # concrete (default) args fx kept as placeholders
        try:
            with torch.no_grad(), torch.device("meta"):
                interp.run(*args)
        except Exception as e:
            node = _failing_node(e, interp)
            module = self.module_of(node) if node is not None and node.op != "call_module" else \
                (node.target if node is not None else "")
            raise _Failure(self.frontend, e, module, _stack_line(node), "shapes") from e
        self.values = interp.values
        for node, value in self.values.items():  # as torch.export keeps them: codegen reads sizes here
            node.meta["val"] = value

    def value(self, node: fx.Node) -> Any:
        return self.values.get(node)

    def site(self, node: fx.Node, args: tuple, kwargs: dict):
        if node.op == "call_module":
            m = self.model.get_submodule(node.target)

            def param(name: str):  # the module's own parameter or buffer; "out_proj.weight" too
                t = m
                for part in name.split("."):
                    t = getattr(t, part, None)
                return _tensor(t, f"param:{node.target}.{name}") if isinstance(t, torch.Tensor) else None

            mc = module_call(m, list(args), dict(kwargs), param)
            return (mc.site, mc.args) if mc is not None else None
        if node.op == "call_method":
            site = METHODS.get(node.target)
        elif node.target is getattr:
            site, args = ATTRIBUTES.get(args[1]), args[:1]
        else:
            site = FUNCTIONS.get(node.target)
        return _bind(site, args, kwargs, node) if site is not None else None


def _failing_node(e: BaseException, interp: MetaProp) -> fx.Node | None:
    """fx.Interpreter runs nodes in order, so the failing node is the first without a value."""
    for n in interp.graph.nodes:
        if n not in interp.values:
            return n
    return None


def _stack_line(node: fx.Node | None) -> str:
    """"file.py:12 (`code`)" from the stack trace fx recorded for ``node``."""
    if node is None or not node.stack_trace:
        return ""
    lines = [ln.strip() for ln in node.stack_trace.strip().splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("File ") and _TORCH_DIR not in lines[i]:
            parts = lines[i].split('"')
            file = os.path.basename(parts[1]) if len(parts) > 1 else "?"
            line = lines[i].split("line ")[-1].split(",")[0]
            code = lines[i + 1] if i + 1 < len(lines) else ""
            return f"{file}:{line}" + (f" (`{code}`)" if code else "")
    return ""


# ---------------------------------------------------------------------------------------------
# front end 2: torch.export (aten-level graph, values already on fake tensors)


_EXPORT_LOGGERS = ("torch._subclasses.fake_tensor", "torch.fx.experimental.symbolic_shapes", "torch.export",
                   "torch._export", "torch._dynamo")


class _ExportFrontend(_Builder):
    frontend = "torch.export"

    def __init__(self, model: nn.Module, inputs: tuple) -> None:
        super().__init__(model)
        self.inputs_given = inputs

    def graph(self) -> Graph:
        # a failed export logs tracebacks and graphs; its exception says it all in one line
        quiet = [logging.getLogger(n) for n in _EXPORT_LOGGERS]
        levels = [q.level for q in quiet]
        for q in quiet:
            q.setLevel(logging.CRITICAL)
        try:
            with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):  # it prints partial graphs
                warnings.simplefilter("ignore")
                ep = torch.export.export(self.model, self.inputs_given, strict=False)
        except Exception as e:
            module, where = _user_frame(e, self.model)
            stage = "trace" if any(k in str(e) for k in _DATA_DEPENDENT) else "shapes"
            raise _Failure(self.frontend, e, module, where, stage) from e
        finally:
            for q, level in zip(quiet, levels):
                q.setLevel(level)
        sig = ep.graph_signature
        state = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
        gm = ep.graph_module
        user_outputs = set(sig.user_outputs)
        outputs: list[tuple[str, int]] = []
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                v = node.meta.get("val")
                if node.name in state and isinstance(v, torch.Tensor):
                    self.env[node] = _tensor(v, f"param:{state[node.name]}")
                else:
                    self.add_input(node, node.name)
            elif node.op == "output":
                for out in node.args[0]:
                    if isinstance(out, fx.Node) and out.name in user_outputs:
                        t = self.env.get(out)
                        outputs += [(x.source, x.output) for x in _flat_tensors(t)]
            elif node.op == "call_function":
                if _state_update(node, self.env):
                    continue
                self.add_call(node)
            elif node.op == "get_attr":
                self.env[node] = getattr(gm, node.target, None)
        gm.meta["autopar_frontend"] = "export"
        gm.meta["autopar_state"] = dict(state)  # placeholder -> parameter/buffer name, for codegen
        gm.meta["autopar_in_spec"] = ep.call_spec.in_spec  # how (args, kwargs) flatten to the inputs
        gm.meta["autopar_out_spec"] = ep.call_spec.out_spec  # how the outputs nest, as the model returns them
        return Graph(self.nodes, self.inputs, outputs, type(self.model).__name__, gm)

    def value(self, node: fx.Node) -> Any:
        return node.meta.get("val")

    def site(self, node: fx.Node, args: tuple, kwargs: dict):
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            site = ATEN.get(target.overloadpacket)
        else:
            site = FUNCTIONS.get(target)
        return _bind(site, args, kwargs, node) if site is not None else None


def _state_update(node: fx.Node, env: dict) -> bool:
    """An in-place op on a parameter or buffer whose result nobody reads, e.g. BatchNorm's
    ``num_batches_tracked += 1``: bookkeeping, not part of the computation to split."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or node.users:
        return False
    first = env.get(node.args[0]) if node.args and isinstance(node.args[0], fx.Node) else None
    return target.overloadpacket.__name__.endswith("_") and isinstance(first, Tensor) and first.source.startswith("param:")
