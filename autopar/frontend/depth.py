"""Tracing a deep model at the cost of a shallow one, for planning: trace three of its layers,
then repeat the middle one to the model's depth.

torch.export of a Hugging Face decoder on meta tensors takes time and memory in proportion to
its layers (an 80-layer Llama 3 70B: minutes and gigabytes), yet its layers are one block
repeated: the same ops on the same shapes, reading the previous layer's output and the same
shared tables (mask, rotary ``cos``/``sin``). ``trace_for_planning`` finds the longest
``ModuleList`` of identical layers (same class, same parameter shapes, same settings: a
sliding-window layer among full-attention ones makes them differ), traces the model with that
list cut to its first ``KEEP`` layers, and builds the full depth's graph from the window:

* layers 0-2 as traced; layer ``L`` after them is layer 2 with every number that differs
  between layer 1 and layer 2 (node names ``linear_14`` vs ``linear_7``, module paths
  ``model.layers.2`` vs ``model.layers.1``, lifted tensors) stepped ``L - 2`` times, its inputs
  from layer 1 taken from layer ``L - 1`` (layer 0 may differ from the rest: ops only the first
  layer runs move the name counters);
* the head and loss after the last layer, their names' counters moved on by the nodes the
  extra layers add.

The window checks itself: its layer 3 must equal layer 2 stepped once, in every field of every
node; otherwise (or when the cut model cannot be traced) the model is traced whole. The graph
equals the full trace's (``tests/frontend/test_depth.py`` compares them field by field on
several model families). Models torch.fx traces are traced whole (fx is fast, and its graph
is the one ``autopar.trace`` gives). The graph has no traced program (``fx_graph`` None, no ``source``): it is for
planning; compiling a plan traces the model whole (``frontend/reuse.py`` sees no trace of it).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import torch.nn as nn

from autopar.core.blocks import block_path
from autopar.core.ir import Graph, Node, Operand

KEEP = 4  # layers traced: 0-2 as themselves (0 may differ), 3 to check that stepping 1 -> 2 gives it
MIN_LAYERS = 6  # below this, tracing the whole model costs little more than the window
_NUMBER = re.compile(r"(\d+)")
_SUFFIX = re.compile(r"^(.*)_(\d+)$")
_SKIP_ATTRS = {"layer_idx", "layer_id", "layer_number", "layer_index", "idx", "training"}


def trace_for_planning(model: nn.Module, example_inputs: Any = (), example_kwargs: Mapping | None = None,
                       *, progress=None) -> Graph:
    """``autopar.trace``'s graph of ``model``, built from a trace of ``KEEP`` of its repeated
    layers where it has at least ``MIN_LAYERS`` identical ones (see the module's docstring)."""
    from autopar.core.loss_lead import mark_count_leads
    from autopar.frontend.trace import trace

    found = repeated_layers(model)
    if found is not None:
        parent, attr, layers = found
        short = nn.ModuleList(list(layers)[:KEEP])
        try:
            setattr(parent, attr, short)
            window = trace(model, example_inputs, example_kwargs, progress=progress)
        except Exception:  # noqa: BLE001 - the cut model may not run (a loop over range(config...)): trace it whole
            window = None
        finally:
            setattr(parent, attr, layers)
        if window is not None and window.frontend == "export":  # fx traces whole models fast
            path = _path_of(model, layers)
            graph = deepen(window, path, len(layers))
            if graph is not None:  # the loss's lead counts the whole depth's forward, not the window's
                return mark_count_leads(graph)
    return trace(model, example_inputs, example_kwargs, progress=progress)


def _path_of(model: nn.Module, target: nn.Module) -> str:
    return next(name for name, m in model.named_modules() if m is target)


def _settings(m: nn.Module) -> tuple:
    """What makes two layers compute the same: classes, parameter and buffer shapes, plain settings."""
    out = []
    for name, sub in m.named_modules():
        plain = tuple(sorted((k, repr(v)) for k, v in vars(sub).items()
                             if not k.startswith("_") and k not in _SKIP_ATTRS
                             and isinstance(v, (int, float, str, bool, tuple, type(None)))))
        state = tuple((k, tuple(t.shape), t.dtype) for k, t in [*sub.named_parameters(recurse=False),
                                                                  *sub.named_buffers(recurse=False)]
                      if t is not None)
        out.append((name, type(sub).__qualname__, plain, state))
    return tuple(out)


def repeated_layers(model: nn.Module) -> tuple[nn.Module, str, nn.ModuleList] | None:
    """(parent, attribute, list) of the longest ``ModuleList`` of at least ``MIN_LAYERS``
    identical layers, or None."""
    best = None
    for _, parent in model.named_modules():
        for attr, child in parent.named_children():
            if not isinstance(child, nn.ModuleList) or len(child) < MIN_LAYERS:
                continue
            if best is not None and len(child) <= len(best[2]):
                continue
            first = _settings(child[0])
            if all(_settings(m) == first for m in list(child)[1:]):
                best = (parent, attr, child)
    return best


# -- the graph at full depth ----------------------------------------------------------------------

def _step(a: str, b: str, k: int) -> str | None:
    """``b`` moved on ``k`` more steps of the difference from ``a`` to ``b`` (every number that
    differs), or None when they differ otherwise. ``linear`` -> ``linear_7``: ``linear_14``."""
    if a == b:
        return a
    if b.startswith(a + "_") and b[len(a) + 1:].isdigit():
        a = a + "_0"
    ta, tb = _NUMBER.split(a), _NUMBER.split(b)
    if len(ta) != len(tb):
        return None
    out = []
    for i, (x, y) in enumerate(zip(ta, tb)):
        if i % 2 == 0:
            if x != y:
                return None
            out.append(x)
        else:
            out.append(str(int(y) + k * (int(y) - int(x))))
    return "".join(out)


def _blocks(graph: Graph, path: str) -> list[tuple[int, int]] | None:
    """[start, end) of layers 0 .. KEEP-1 of ``path`` in the window, when each is one run of nodes
    and they follow each other."""
    where: dict[str, list[int]] = {}
    for i, n in enumerate(graph.nodes):
        p = block_path(n.module)
        if p is not None and p.startswith(path + "."):
            where.setdefault(p, []).append(i)
    names = [f"{path}.{k}" for k in range(KEEP)]
    if sorted(where) != sorted(names):
        return None
    spans = [(where[p][0], where[p][-1] + 1) for p in names]
    if any(len(where[p]) != b - a for p, (a, b) in zip(names, spans)):
        return None
    if any(spans[k][1] != spans[k + 1][0] for k in range(KEEP - 1)):
        return None
    size = spans[1][1] - spans[1][0]
    return spans if all(b - a == size for a, b in spans[1:]) else None


class _Stepper:
    """Layer ``L >= 2`` of the full graph: the window's layer 2 with what differs from layer 1
    stepped ``L - 2`` times (layer 0 may differ: counters of ops only the first layer runs)."""

    def __init__(self, graph: Graph, spans: list[tuple[int, int]]):
        self.first = graph.nodes[spans[1][0]:spans[1][1]]
        self.second = graph.nodes[spans[2][0]:spans[2][1]]
        self.pos1 = {n.name: p for p, n in enumerate(self.first)}
        self.pos2 = {n.name: p for p, n in enumerate(self.second)}
        self.names: dict[int, list[str]] = {1: [n.name for n in self.first], 2: [n.name for n in self.second]}

    def name(self, layer: int, p: int) -> str | None:
        if layer not in self.names:
            row = [_step(a.name, b.name, layer - 2) for a, b in zip(self.first, self.second)]
            if any(r is None for r in row):
                return None
            self.names[layer] = row
        return self.names[layer][p]

    def layer(self, layer: int) -> list[Node] | None:
        k = layer - 2
        out = []
        for p, (a, b) in enumerate(zip(self.first, self.second)):
            name, module = self.name(layer, p), _step(a.module, b.module, k)
            if name is None or module is None or len(a.params) != len(b.params):
                return None
            def source(src: str) -> str | None:
                if src in self.pos2:
                    return self.name(layer, self.pos2[src])
                if src in self.pos1:
                    return self.name(layer - 1, self.pos1[src])
                return src

            ins = [dataclasses.replace(op, source=source(op.source)) for op in b.inputs]
            if any(op.source is None for op in ins):
                return None
            params = []
            for pa, pb in zip(a.params, b.params):
                src = _step(pa.source, pb.source, k)
                if src is None:
                    return None
                params.append(dataclasses.replace(pb, source=src))
            attrs = dict(b.attrs)
            for key, v in b.attrs.items():  # names in attributes: a weight view's parameter, nodes read
                if isinstance(v, str) and isinstance(a.attrs.get(key), str) and a.attrs[key] != v:
                    attrs[key] = _step(a.attrs[key], v, k)
                elif key == "metadata_reads":
                    attrs[key] = tuple((source(n), i) for n, i in v)
                    if any(n is None for n, _ in attrs[key]):
                        return None
            if any(v is None for v in attrs.values()):
                return None
            out.append(dataclasses.replace(b, name=name, module=module, inputs=tuple(ins), params=tuple(params),
                                           attrs=attrs))
        return out


def deepen(window: Graph, path: str, depth: int) -> Graph | None:
    """The graph of the model with ``depth`` layers under ``path``, from ``window`` (traced with
    its first ``KEEP``); None when the window does not check out."""
    spans = _blocks(window, path)
    if spans is None:
        return None
    step = _Stepper(window, spans)
    if step.layer(3) != window.nodes[spans[3][0]:spans[3][1]]:
        return None
    last = spans[-1][1]
    grow: dict[str, int] = {}  # name counter -> how much one layer moves it on
    for a, b in zip(step.first, step.second):
        ma, mb = _SUFFIX.match(a.name), _SUFFIX.match(b.name)
        base = ma.group(1) if ma else a.name
        if mb and mb.group(1) == base:
            grow[base] = int(mb.group(2)) - (int(ma.group(2)) if ma else 0)
    extra = depth - KEEP
    rename: dict[str, str] = {}
    for n in window.nodes[last:]:
        m = _SUFFIX.match(n.name)
        base, k = (m.group(1), int(m.group(2))) if m else (n.name, 0)
        if grow.get(base):
            rename[n.name] = f"{base}_{k + extra * grow[base]}"
    for p, n in enumerate(window.nodes[spans[-1][0]:last]):
        rename[n.name] = step.name(depth - 1, p)
    nodes = list(window.nodes[:spans[-1][0]])
    for layer in range(KEEP - 1, depth):
        made = step.layer(layer)
        if made is None:
            return None
        nodes.extend(made)
    for n in window.nodes[last:]:
        ins = tuple(dataclasses.replace(o, source=rename.get(o.source, o.source)) for o in n.inputs)
        attrs = dict(n.attrs)
        if "metadata_reads" in attrs:
            attrs["metadata_reads"] = tuple((rename.get(s, s), i) for s, i in attrs["metadata_reads"])
        nodes.append(dataclasses.replace(n, name=rename.get(n.name, n.name), inputs=ins, attrs=attrs))
    if len({n.name for n in nodes}) != len(nodes):
        return None
    outputs = [(rename.get(s, s), k) for s, k in window.outputs]
    graph = Graph(nodes, dict(window.inputs), outputs, window.model_name, None, frontend=window.frontend)
    graph.call = window.call
    return graph
