"""What a trace leaves behind is freed by reference counting, not by a full garbage collection.

A plan made in a notebook is usually made again: a model built, planned, dropped, built again. What
tracing leaves in a reference cycle is freed only by a full collection, which Python seldom runs
when the memory is in a few large tensors: five RNNLMs planned one after the other held five
models' weights (9.6 GB). Three cycles held them, each broken here:

- torch.fx's ``Proxy.__iter__`` reads the calling instruction from ``inspect.currentframe().f_back``
  and keeps that frame object in a local of its own frame: the frame refers to itself. Through
  ``f_back`` it holds every frame up the stack (the model's forward with the model, the tracer,
  the planner's frame with its graph and cost tables, the caller's locals).
  ``Proxy`` looks at the calling frame without keeping it.
- ``fx.Tracer.trace`` leaves the tracer in cycles of its own closures (a recursive local function),
  the tracer holding the model as ``root``: ``release_tracer`` empties it once the trace is built.
- A GraphModule and its fx Graph point at each other (``graph.owning_module``), and the module
  holds the model's submodules and their weights: ``weak_owner`` makes the graph's pointer weak,
  so the module goes with the last reference to it.

And a failed trace (fx, before export is tried; a dynamic-batch export, before a static one) keeps
its frames in its exception's traceback, some of them in cycles of torch's own (export's guard
solver keeps the exception it raises in a local of a frame on that exception's traceback):
``release_frames`` clears the finished frames' locals once the failure is described.

torch.export's own tracer stays in such a closure cycle with the model (its non-strict wrapper
module), out of our reach: ``collect_after_export`` runs the collection that frees it, a young
generation's (about a millisecond) for a small model, a full one (0.1-0.2 s, against the seconds
an export takes) where the weights are large enough to matter.
"""

from __future__ import annotations

import dis
import gc
import itertools
import sys
import traceback
import weakref
from bisect import bisect_left
from typing import Iterator

from torch import fx, nn

FULL_COLLECT_BYTES = 64 * 2**20  # real weights from which a full collection after an export pays


def _unpacked_count(code, lasti: int) -> int | None:
    """How many values the instruction at ``lasti`` unpacks (None: it is not an unpacking)."""
    insts = list(dis.get_instructions(code))
    inst = insts[bisect_left(insts, lasti, key=lambda x: x.offset)]
    return inst.argval if inst.opname == "UNPACK_SEQUENCE" else None


class Proxy(fx.Proxy):
    """``fx.Proxy`` with torch's unpacking rule, minus its self-referencing frame."""

    def __iter__(self) -> Iterator[fx.Proxy]:
        caller = sys._getframe(1)
        try:
            count = _unpacked_count(caller.f_code, caller.f_lasti)
        finally:
            del caller  # the frame must not outlive this call
        if count is not None:
            return (self[i] for i in range(count))
        return self.tracer.iter(self)


def release_tracer(tracer: fx.Tracer) -> None:
    """Drop what a finished tracer holds (the model as ``root``, the graph, tensor attributes):
    torch's closures keep the tracer itself in a cycle."""
    vars(tracer).clear()


def weak_owner(gm: fx.GraphModule) -> fx.GraphModule:
    """Make ``gm.graph``'s pointer back to ``gm`` weak (fx uses it for hooks and attribute checks
    while the module lives; nothing reads it after)."""
    gm.graph.owning_module = weakref.proxy(gm)
    return gm


def release_frames(exc: BaseException) -> None:
    """Clear the locals of the finished frames on ``exc``'s traceback and those of its causes and
    contexts (frames still running are left as they are)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        todo += [e.__cause__, e.__context__, getattr(e, "cause", None)]


def collect_after_export(model: nn.Module) -> None:
    """Free what torch.export left in cycles: a full collection when the model's real (not meta)
    weights reach ``FULL_COLLECT_BYTES``, else the two young generations."""
    tensors = itertools.chain(model.parameters(), model.buffers())
    weights = sum(t.nbytes for t in tensors if t.device.type != "meta")
    gc.collect(2 if weights >= FULL_COLLECT_BYTES else 1)
