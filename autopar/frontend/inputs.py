"""The example call as the model takes it: positional inputs, keyword inputs, or one dict.

Hugging Face models are called ``model(input_ids=..., labels=...)``; plain modules ``model(x)``.
``example_call`` turns what a user hands ``trace``/``plan`` into one ``ExampleCall`` (args, kwargs),
checked against ``model.forward``'s signature so a wrong call fails in one line before tracing.
The batch size is dim 0 of the batched inputs: the most common dim-0 size among the tensor
inputs (the first one's on a tie), a fact front ends record and torch.export makes symbolic.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from autopar.core.call import leaf_paths


@dataclass
class ExampleCall:
    """``model(*args, **kwargs)``: the call the graph is traced from."""

    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def leaves(self) -> list[tuple[str, Any]]:
        """``[(path, leaf)]`` in pytree order: ``args[0]``, ``input_ids``, ``hx[1]``..."""
        return leaf_paths(self.args, self.kwargs)

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        return [(p, v) for p, v in self.leaves() if isinstance(v, torch.Tensor)]

    def describe(self) -> str:
        """``input_ids (2, 16), labels (2, 16)`` for messages."""
        parts = []
        for path, v in self.leaves():
            text = str(tuple(v.shape)) if isinstance(v, torch.Tensor) else type(v).__name__
            parts.append(text if not self.kwargs else f"{path} {text}")
        return ", ".join(parts) or "none"

    def batch(self) -> tuple[int | None, list[str]]:
        """(batch size, paths of the tensors whose dim 0 is it); (None, []) without batched tensors."""
        firsts = [(p, int(t.shape[0])) for p, t in self.tensors() if t.dim() >= 1]
        if not firsts:
            return None, []
        counts = Counter(size for _, size in firsts)
        best = max(counts.values())
        size = next(s for _, s in firsts if counts[s] == best)
        return size, [p for p, s in firsts if s == size]


def example_call(model: nn.Module, example_inputs: Any = (), example_kwargs: Mapping | None = None) -> ExampleCall:
    """Normalize and check the example call; ValueError (one line) when it cannot be a call of ``model``.

    ``example_inputs``: a tuple/list of positional inputs, one tensor (a single input), or one dict
    of keyword inputs (then ``example_kwargs`` must be None). ``example_kwargs``: keyword inputs.
    To pass a dict as a single positional input, wrap it in a tuple: ``(d,)``.
    """
    if isinstance(example_inputs, Mapping):
        if example_kwargs is not None:
            raise ValueError("example_inputs is a dict of keyword inputs and example_kwargs is given too: pass "
                             "the keyword inputs once (to pass a dict positionally, wrap it: example_inputs=(d,))")
        args, kwargs = (), dict(example_inputs)
    else:
        if example_inputs is None:
            args = ()
        elif isinstance(example_inputs, (list, tuple)) and not hasattr(example_inputs, "_fields"):
            args = tuple(example_inputs)
        else:
            args = (example_inputs,)
        if example_kwargs is not None and not isinstance(example_kwargs, Mapping):
            raise ValueError(f"example_kwargs must be a dict of keyword inputs, not {type(example_kwargs).__name__}")
        kwargs = dict(example_kwargs or {})
    bad = [k for k in kwargs if not isinstance(k, str)]
    if bad:
        raise ValueError(f"keyword input names must be strings, got {bad[0]!r}")
    call = ExampleCall(args, kwargs)
    _check_signature(model, call)
    return call


def _check_signature(model: nn.Module, call: ExampleCall) -> None:
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*call.args, **call.kwargs)
    except TypeError as e:
        given = f"{len(call.args)} positional input(s)" + (f" and {', '.join(call.kwargs)}" if call.kwargs else "")
        raise ValueError(f"example_inputs do not fit {type(model).__name__}.forward{sig}: {e} (got {given})") from None


def bound_arguments(model: nn.Module, call: ExampleCall) -> dict[str, Any] | None:
    """forward's parameter name -> the value the call gives it (defaults filled); None without a signature."""
    try:
        bound = inspect.signature(model.forward).bind(*call.args, **call.kwargs)
    except (TypeError, ValueError):
        return None
    bound.apply_defaults()
    return dict(bound.arguments)
