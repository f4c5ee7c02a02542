"""What every rule reads (a ``Call``) and returns (a ``Result``), and the helpers they share.

A front end (torch.fx or torch.export) resolves every argument of a traced call first: tensors
become ``Tensor`` values (shape, dtype and where they come from), symbolic sizes become plain ints.
So a rule is a pure function of static shapes and constants, the same for both front ends.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any

from autopar.core.ir import AxisDims, Dim


@dataclass(frozen=True)
class Tensor:
    """A tensor argument or result: static shape and dtype, and the operand it is.

    ``source``/``output`` follow ``ir.Operand`` (a node name, ``input:<x>`` or ``param:<q.name>``);
    results of the call being ruled have ``source == ""``.
    """

    shape: tuple[int, ...]
    dtype: str
    source: str = ""
    output: int = 0

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class Call:
    """One traced call, arguments bound to the parameter names of its site's signature."""

    op: str  # the rule to apply
    target: str  # what the model called, for messages and ``Node.target``
    args: dict[str, Any]  # bound arguments: Tensor, list of Tensor, or constants
    outs: tuple[Tensor, ...]  # the call's tensor results, flattened in order
    fixed: dict[str, Any] = field(default_factory=dict)  # site constants, e.g. {"fn": "relu"}

    def tensors(self) -> list[Tensor]:
        """Every tensor argument in call order (lists flattened)."""
        found: list[Tensor] = []
        for v in self.args.values():
            collect_tensors(v, found)
        return found


def collect_tensors(value: Any, found: list, kinds: tuple[type, ...] = (Tensor,)) -> None:
    """Append every object of ``kinds`` inside nested lists, tuples and dicts, in order."""
    if isinstance(value, kinds):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            collect_tensors(v, found, kinds)
    elif isinstance(value, dict):
        for v in value.values():
            collect_tensors(v, found, kinds)


@dataclass
class Result:
    """A rule's answer: the iteration space and how each tensor it touches maps onto it.

    ``reads`` lists every tensor operand (data and parameters alike, in call order) with its axis
    map; the builder sorts them into ``Node.inputs`` and ``Node.params`` by their source.
    ``bytes_read``/``bytes_written`` default to the sizes of ``reads`` and ``outs``; metadata-only
    ops (views, permutes, slices) set them to 0 because they move no data. ``metadata_reads``
    lists tensors the call reads for their dtype or device only (``x.type_as(y)``'s ``y``): no
    layout, no bytes. Every tensor argument is in one of the two lists, or the node is replicated.
    """

    op: str
    dims: list[Dim]
    reads: list[tuple[Tensor, tuple[AxisDims, ...]]]
    out_axes: list[tuple[AxisDims, ...]]
    flops: int = 0
    attrs: dict[str, Any] = field(default_factory=dict)
    bytes_read: int | None = None
    bytes_written: int | None = None
    unsupported: str = ""
    metadata_reads: list[Tensor] = field(default_factory=list)  # read for dtype/device only


def signature(text: str) -> inspect.Signature:
    """``"input, weight, bias=None"`` -> an ``inspect.Signature`` to bind traced args against."""
    namespace: dict[str, Any] = {}
    exec(f"def f({text}): pass", namespace)  # a literal from the site tables, never user text
    return inspect.signature(namespace["f"])


def names_axes(names: list[str]) -> tuple[AxisDims, ...]:
    """One dim per axis: ``["b", "s"]`` -> ``(("b",), ("s",))``."""
    return tuple((n,) for n in names)


def generic_names(n: int, prefix: str = "d") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def lead_names(n: int) -> list[str]:
    """Names for the leading (batch-like) axes of an op: b, then s, then s2, s3, ..."""
    return ["b", "s", *(f"s{i}" for i in range(2, n))][:n]


def broadcast_axes(shape: tuple[int, ...], out_shape: tuple[int, ...], names: list[str]):
    """Axis map of an operand broadcast (right-aligned) to ``out_shape`` whose axes are ``names``.

    An axis of size 1 stretched to a larger output axis maps to ``()``: it holds one value that
    every shard needs, so it cannot be split along with the output.
    """
    offset = len(out_shape) - len(shape)
    axes = []
    for i, size in enumerate(shape):
        j = i + offset
        axes.append((names[j],) if j >= 0 and size == out_shape[j] else ())
    return tuple(axes)


def norm_axis(axis: int, ndim: int) -> int:
    return axis + ndim if axis < 0 else axis


def as_tuple(value, n: int) -> tuple:
    """``3`` -> ``(3, 3)`` for n=2; lists become tuples; already-long tuples stay."""
    if isinstance(value, (list, tuple)):
        return tuple(value) if len(value) != 1 else tuple(value) * n
    return (value,) * n


def plain_attrs(args: dict[str, Any], skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The constant (non-tensor) arguments of a call, to record as ``Node.attrs``."""
    out = {}
    for k, v in args.items():
        if k in skip or isinstance(v, Tensor):
            continue
        if isinstance(v, (list, tuple)) and any(isinstance(x, Tensor) for x in v):
            continue
        out[k] = tuple(v) if isinstance(v, list) else v
    return out


def same_dims(names: list[str], shape: tuple[int, ...], unsplittable=(), reduction=()) -> list[Dim]:
    return [Dim(n, s, reduction=n in reduction, splittable=n not in unsplittable)
            for n, s in zip(names, shape)]
