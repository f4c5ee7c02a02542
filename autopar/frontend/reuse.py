"""Whether a graph traced earlier in this process is the graph of a given call, so that
``autopar.compile(model, inputs, plan=plan)`` right after ``autopar.plan(model, inputs)`` does
not trace the model a second time (torch.export of a Hugging Face model takes seconds).

The graph remembers its model (weakly: a graph must not keep a model alive) and a signature of
what its trace depended on: every submodule's path, class and train/eval mode, every parameter's
and buffer's name, shape and dtype, and the inputs' structure, shapes and dtypes (other input
values as they are). A model changed in any of these since is traced again; a model whose class
code was edited in between is not detected (not a case inside one process).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.utils import _pytree as pytree


def _gone() -> None:
    return None


@dataclass(frozen=True)
class TracedFrom:
    model: Any  # weakref.ref to the nn.Module (called: the model, or None)
    signature: tuple

    def __reduce__(self):
        """A graph sent to another process is not a trace of any model there: no weakref travels."""
        return TracedFrom, (_gone, ())


def signature(model: nn.Module, args: tuple, kwargs: dict) -> tuple:
    modules = tuple((name, type(m).__module__, type(m).__qualname__, m.training) for name, m in model.named_modules())
    state = tuple((name, tuple(t.shape), t.dtype, t.requires_grad)
                  for name, t in [*model.named_parameters(), *model.named_buffers()])
    leaves, spec = pytree.tree_flatten((args, kwargs))
    inputs = tuple((tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else (type(v).__name__, repr(v))
                   for v in leaves)
    return modules, state, inputs, str(spec)


def traced_from(model: nn.Module, args: tuple, kwargs: dict) -> TracedFrom:
    return TracedFrom(weakref.ref(model), signature(model, args, kwargs))


def is_trace_of(graph: Any, model: nn.Module, args: tuple, kwargs: dict) -> bool:
    """True when ``graph`` was traced by ``autopar.trace`` from this very model and a call of the
    same shapes, and nothing it depended on has changed since."""
    src = getattr(graph, "source", None)
    if not isinstance(src, TracedFrom) or src.model() is not model:
        return False
    return src.signature == signature(model, args, kwargs)
