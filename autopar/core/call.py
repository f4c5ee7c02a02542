"""How the traced model is called and what it returns, around the graph's flat tensors.

A graph has flat tensor inputs (placeholders) and flat tensor outputs; a model is called as
``model(input_ids=..., labels=...)`` and returns a ``ModelOutput``, a dict, a tuple or a tensor.
``CallSpec`` is the bridge both ways, kept beside the graph so that code generation can take the
user's call as it comes (``flatten``) and hand back what the model returns (``unflatten``), with
one-line errors where a call does not match the traced one (``check``). Structures are torch
pytrees: whatever ``torch.utils._pytree`` knows (tuples, lists, dicts, namedtuples, dataclasses
registered by a library such as transformers' ``ModelOutput``) keeps its type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.utils._pytree as pytree


@dataclass(frozen=True)
class InputLeaf:
    """One leaf of the traced call ``(args, kwargs)``: a tensor (a graph input) or a constant."""

    path: str  # "input_ids", "args[0]", "hx[1]": where the leaf sits in the call
    placeholder: str = ""  # the graph input this tensor is; "" for a constant
    value: Any = None  # the constant the graph was traced with (a bool, an int, a string)


@dataclass(frozen=True)
class OutputLeaf:
    """One leaf of what the model returns: a graph output, a constant, or a leaf left out."""

    path: str  # "loss", "[0]", "logits"
    output: int | None = None  # index into ``Graph.outputs`` for a tensor
    value: Any = None  # a constant returned as it is
    dropped: str = ""  # why this leaf is not returned (e.g. a key/value cache object); None stands in


@dataclass
class CallSpec:
    """The traced call's structure: input and output pytrees, their leaves, and the batch size.

    ``batch`` is dim 0 of the batched inputs (those listed in ``batched``) in the example call;
    ``dynamic_batch`` says whether the graph was captured with that dim symbolic (it then runs for
    any size in ``batch_range``), otherwise it holds only for ``batch``.
    """

    in_spec: pytree.TreeSpec
    inputs: tuple[InputLeaf, ...]
    out_spec: pytree.TreeSpec
    outputs: tuple[OutputLeaf, ...]
    batch: int | None = None
    batched: tuple[str, ...] = ()
    dynamic_batch: bool = False
    batch_range: tuple[int, int | None] = (1, None)
    training: bool = True  # the mode the model was in when traced (export freezes it)
    notes: list[str] = field(default_factory=list)  # what the front end did the user should know

    @property
    def input_names(self) -> list[str]:
        """The graph inputs (placeholders) in order."""
        return [leaf.placeholder for leaf in self.inputs if leaf.placeholder]

    @property
    def dropped(self) -> list[OutputLeaf]:
        return [leaf for leaf in self.outputs if leaf.dropped]

    def flatten(self, args: tuple = (), kwargs: dict | None = None) -> list[torch.Tensor]:
        """The call's tensors in graph-input order; ValueError (one line) when it is not the traced call."""
        given = dict(leaf_paths(args, kwargs or {}))
        expected = {leaf.path for leaf in self.inputs}
        missing = [leaf.path for leaf in self.inputs if leaf.path not in given]
        extra = [p for p in given if p not in expected]
        if missing or extra:
            parts = ([f"missing {', '.join(missing)}"] if missing else []) + \
                ([f"unexpected {', '.join(extra)}"] if extra else [])
            raise ValueError(f"inputs do not match the traced call ({'; '.join(parts)}): call it with "
                             f"{self.describe_inputs()}, or trace again with the inputs you will pass")
        tensors = []
        for leaf in self.inputs:
            value = given[leaf.path]
            if leaf.placeholder:
                if not isinstance(value, torch.Tensor):
                    raise ValueError(f"{leaf.path} was traced as a tensor, got {type(value).__name__}")
                tensors.append(value)
            elif not _same_constant(value, leaf.value):
                raise ValueError(f"{leaf.path}={leaf.value!r} is fixed in the traced graph, got {value!r}: "
                                 f"trace again with {leaf.path}={value!r}")
        return tensors

    def check(self, args: tuple = (), kwargs: dict | None = None) -> list[torch.Tensor]:
        """``flatten``, and a one-line ValueError when the batch size is one the graph was not made for."""
        tensors = self.flatten(args, kwargs)
        if self.batch is None:
            return tensors
        named = dict(zip(self.input_names, tensors))
        sizes = {name: int(named[name].shape[0]) for name in self.batched if named[name].dim() > 0}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"the batched inputs disagree on the batch size: {sizes}")
        size = next(iter(sizes.values()), self.batch)
        lo, hi = self.batch_range
        if self.dynamic_batch and size >= lo and (hi is None or size <= hi):
            return tensors
        if size != self.batch:
            what = (f"batch sizes {lo}..{hi if hi is not None else ''}" if self.dynamic_batch
                    else f"batch size {self.batch} only")
            raise ValueError(f"got batch size {size}, but the graph was traced for {what}: trace (and compile) "
                             f"again with a batch of {size}, or drop the last incomplete batch "
                             f"(DataLoader(drop_last=True))")
        return tensors

    def unflatten(self, outputs: Sequence[Any]) -> Any:
        """What the model returns, built from the graph's outputs (in ``Graph.outputs`` order)."""
        leaves = []
        for leaf in self.outputs:
            if leaf.output is not None:
                leaves.append(outputs[leaf.output])
            else:
                leaves.append(None if leaf.dropped else leaf.value)
        return pytree.tree_unflatten(leaves, self.out_spec)

    def describe_inputs(self) -> str:
        return ", ".join(leaf.path if leaf.placeholder else f"{leaf.path}={leaf.value!r}" for leaf in self.inputs)


def leaf_paths(args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """``[(path, leaf)]`` of a call: ``args[0]``, ``input_ids``, ``hx[1]``, in pytree order."""
    flat, _ = pytree.tree_flatten_with_path((tuple(args), dict(kwargs)))
    return [(path_name(path), leaf) for path, leaf in flat]


def path_name(path: tuple) -> str:
    """A call leaf's key path as a user writes it: ``(0, 1)`` -> ``args[1]``; ``(1, 'x', 0)`` -> ``x[0]``."""
    if not path:
        return ""
    head, rest = path[0], path[1:]
    top = getattr(head, "idx", None)
    if top == 0 and rest:  # positional: args[i]
        return f"args{pytree.keystr(rest)}"
    if top == 1 and rest:  # keyword: name, then its inside
        key = getattr(rest[0], "key", rest[0])
        return f"{key}{pytree.keystr(rest[1:])}"
    return pytree.keystr(path)


def output_path(path: tuple) -> str:
    """An output leaf's key path: ``.loss``/``['loss']`` -> ``loss``, ``[0]`` stays ``[0]``."""
    text = pytree.keystr(path)
    if text.startswith("['") and text.endswith("']") and text.count("[") == 1:
        return text[2:-2]
    return text.lstrip(".") or "output"


def _same_constant(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:  # an object without a plain ==: only itself matches
        return a is b
