"""``trace(model, example_inputs, example_kwargs) -> ir.Graph``: the first stage of the pipeline.

Two front ends share one set of rules (``autopar.frontend.rules``) and one builder
(``autopar.frontend.build``):

1. torch.fx ``symbolic_trace`` with shapes propagated on meta tensors (``autopar.frontend.fx``).
2. When fx cannot trace the model (Python control flow on shapes, modules it cannot enter, and
   every Hugging Face model): ``torch.export.export`` (``autopar.frontend.export``), whose aten
   nodes map onto the same rules. Outputs export cannot return (a generation cache) are dropped,
   not fatal; the batch dim is exported dynamic where the model allows it.

The graph records where its nodes came from (``graph.frontend``: "fx" or "export"), the fx
GraphModule (``graph.fx_graph``; for export the program's, with the ``ExportedProgram`` itself in
``graph.program``), and the call around its flat tensors (``graph.call``: input names, output
structure, batch size). When both front ends fail, a ``TraceError`` names the module, the source
line and what to do, in one line. Neither front end changes the model (``frontend/pristine.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.nn as nn

from autopar.core.errors import TraceError
from autopar.core.ir import Graph
from autopar.frontend.failures import Failure, message
from autopar.frontend.inputs import ExampleCall, example_call
from autopar.frontend.pristine import unchanged
from autopar.frontend.reuse import traced_from

FRONTENDS = ("auto", "fx", "export")


def trace(model: nn.Module, example_inputs: Any = (), example_kwargs: Mapping | None = None, *,
          frontend: str = "auto", progress=None) -> Graph:
    """Trace ``model(*example_inputs, **example_kwargs)`` into an ``ir.Graph``.

    ``example_inputs``: the positional inputs (a tuple, or one tensor), or one dict of keyword
    inputs (``{"input_ids": ids, "labels": ids}``, as Hugging Face models are called).
    ``example_kwargs``: keyword inputs beside positional ones.
    ``frontend``: "auto" (fx, then torch.export if fx fails), "fx" or "export" (to force one).
    ``progress``: a status line ``"tracing <Model> ... 1.2 s"`` (``autopar.core.progress.phase``):
    None shows it on stderr when stderr is a terminal, a stream shows it there when that stream is
    a terminal, True always (on stderr), False never. Nothing is written off a terminal.
    Raises ``TraceError`` (one actionable line) when the model cannot be traced, ``ValueError``
    when the example inputs do not fit ``model.forward``'s signature.
    """
    if frontend not in FRONTENDS:
        raise ValueError(f"frontend must be 'auto', 'fx' or 'export', not {frontend!r}")
    if not isinstance(model, nn.Module):
        raise TraceError(f"autopar traces a torch.nn.Module (its parameters are what it shards), not a "
                         f"{type(model).__name__}: wrap the computation in an nn.Module")
    call = example_call(model, example_inputs, example_kwargs)
    from autopar.core.backward import mark_backward
    from autopar.core.loss_lead import mark_count_leads
    from autopar.core.progress import phase

    if progress is None or isinstance(progress, bool):
        stream, enabled = None, progress
    else:
        stream, enabled = progress, None
    with phase(f"tracing {type(model).__name__}", stream=stream, enabled=enabled):
        graph = _trace(model, call, frontend)
    mark_count_leads(graph)  # what a counted loss's count overlaps with (core/loss_lead.py)
    mark_backward(graph)  # which nodes run a backward, which inputs take a gradient (core/backward.py)
    graph.source = traced_from(model, call.args, call.kwargs)  # compile reuses it (frontend/reuse.py)
    return graph


def _trace(model: nn.Module, call: ExampleCall, frontend: str) -> Graph:
    from autopar.frontend.export import ExportFrontend
    from autopar.frontend.fx import FxFrontend

    failures: list[Failure] = []
    try:
        if frontend in ("auto", "fx"):
            try:
                with unchanged(model):  # each front end sees the model as the user left it, and leaves it so
                    return FxFrontend(model, call).graph()
            except Failure as f:
                failures.append(f)
        if frontend in ("auto", "export"):
            try:
                with unchanged(model):
                    return ExportFrontend(model, call).graph()
            except Failure as f:
                failures.append(f)
        raise TraceError(message(model, call.describe(), failures)) from failures[0].cause
    finally:
        # A failure's traceback holds this frame, and this frame's list holds the failure: a cycle
        # through the failed trace's frames (its tracer, the model and its weights) that only a full
        # garbage collection would free. Emptying the list breaks it.
        failures.clear()
