"""The torch.fx graph a fusion starts from, and the check that K models share it.

Fusion rewrites the module-level fx graph (``nn.Linear`` stays one node, so it can become one
fused layer with the same qualified name). ``symbolic_trace`` keeps shapes symbolic, so a fused
model accepts any batch size the originals did; a model whose forward computes with its shapes
in Python (``math.sqrt(x.shape[-1])``) is traced again with concrete shapes from the example
inputs (torch.fx's ``MetaTracer``, run on a meta copy of the model: no weight is copied), and
its fused form then takes inputs of those shapes only.
"""

from __future__ import annotations

import copy
import inspect
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from autopar.core.errors import TraceError
from autopar.core.meta import MetaProp, to_meta


class _Tracer(fx.Tracer):
    """Buffers become graph values too (``self.mask[:s]``), not constants baked into the code."""

    proxy_buffer_attributes = True


def _meta_tracer():
    from torch.fx.experimental.meta_tracer import MetaTracer

    class _Concrete(MetaTracer):
        proxy_buffer_attributes = True

    return _Concrete()


def _meta_copy(model: nn.Module) -> nn.Module:
    """The module tree with every parameter and buffer on the meta device (nothing allocated)."""
    memo: dict[int, Any] = {}
    for t in [*model.parameters(), *model.buffers()]:
        meta = t.to("meta")
        memo[id(t)] = nn.Parameter(meta, t.requires_grad) if isinstance(t, nn.Parameter) else meta
    return copy.deepcopy(model, memo)


@dataclass
class Traced:
    gm: fx.GraphModule
    values: dict[fx.Node, Any]  # every node's value on meta tensors (shapes, ranks, Python values)
    concrete_shapes: bool  # True: traced with the example inputs' shapes baked in


def _inputs(model: nn.Module, example_inputs) -> tuple:
    inputs = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
    params = [p for p in inspect.signature(model.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(inputs) > len(params):
        raise ValueError(f"fuse: {type(model).__name__}.forward takes {len(params)} inputs, "
                         f"example_inputs has {len(inputs)}")
    return inputs


def trace(model: nn.Module, example_inputs) -> Traced:
    inputs = _inputs(model, example_inputs)
    names = list(inspect.signature(model.forward).parameters)[: len(inputs)]
    concrete = False
    try:
        graph = _Tracer().trace(model)
    except Exception as first:
        meta_model = _meta_copy(model)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                graph = _meta_tracer().trace(meta_model, {n: to_meta(x) for n, x in zip(names, inputs)})
        except Exception as e:
            raise TraceError(f"fuse: cannot trace {type(model).__name__} with torch.fx ({str(first).splitlines()[0]}; "
                             f"with concrete shapes: {str(e).splitlines()[0]}): make forward traceable "
                             "(no Python control flow on tensor values)") from e
        concrete = True
    # the meta copy's modules are structurally the original's: the graph module roots at the model
    gm = fx.GraphModule(model, graph, type(model).__name__)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    args = [to_meta(x) for x in inputs] + [None] * (len(placeholders) - len(inputs))
    interp = MetaProp(gm)
    try:
        with torch.no_grad(), torch.device("meta"):
            interp.run(*args)
    except Exception as e:
        raise TraceError(f"fuse: running {type(model).__name__} on its example inputs failed: "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}; check example_inputs") from e
    return Traced(gm, interp.values, concrete)


def _state_signature(model: nn.Module) -> list[tuple]:
    out = [(n, "param", tuple(p.shape), p.dtype, p.requires_grad) for n, p in model.named_parameters()]
    out += [(n, "buffer", tuple(b.shape), b.dtype) for n, b in model.named_buffers()]
    return out


def check_same(models: list[nn.Module], first: Traced, example_inputs) -> None:
    """Raise unless every model is model 0 up to parameter values (same graph, shapes, layers)."""
    ref_state = _state_signature(models[0])
    tied = _tied(models[0])
    if tied:
        raise TraceError(f"fuse: {type(models[0]).__name__} shares one parameter between {tied}; "
                         "fuse does not support tied parameters yet: untie them")
    ref_code = first.gm.code
    for k, m in enumerate(models[1:], start=1):
        if type(m) is not type(models[0]):
            raise TraceError(f"fuse: model {k} is a {type(m).__name__}, model 0 a {type(models[0]).__name__}; "
                             "fuse takes models of one architecture")
        state = _state_signature(m)
        if state != ref_state:
            diff = next((a, b) for a, b in zip(state + [None] * len(ref_state), ref_state + [None] * len(state))
                        if a != b)
            raise TraceError(f"fuse: model {k}'s parameters differ from model 0's ({diff[0]} vs {diff[1]}); "
                             "fuse takes models with equal shapes")
        if str(m) != str(models[0]):
            raise TraceError(f"fuse: model {k}'s layers are configured differently from model 0's "
                             "(compare print(model)); fuse takes models with equal layers")
        code = trace(m, example_inputs).gm.code
        if code != ref_code:
            raise TraceError(f"fuse: model {k}'s forward traces to a different graph from model 0's; "
                             "fuse takes models that run the same operations")


def _tied(model: nn.Module) -> str:
    seen: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen and seen[id(p)] != name:
            return f"{seen[id(p)]} and {name}"
        seen.setdefault(id(p), name)
    return ""
