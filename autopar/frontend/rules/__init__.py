"""One small rule per op kind: each turns a traced call into an ir.Node with its iteration space.

``RULES`` maps each op family's name (``autopar.core.op_families``) to its rule;
``autopar.frontend.rules.sites`` maps what a model calls (a module type, a ``torch``/``F``
function, a Tensor method, an aten op) to a rule and the signature its arguments bind to. ``build_node`` applies one and assembles the
``ir.Node``; a rule that cannot handle a call becomes an explicit opaque node, never a crash.
"""

from __future__ import annotations

import importlib
from collections import Counter

from autopar.core.ir import METADATA_READS, Dim, Node, Operand, TensorSpec
from autopar.core.op_families import FAMILIES, op_kinds
from autopar.frontend.rules import opaque
from autopar.frontend.rules.base import Call, Result, Tensor

# each family's rule module and its rule, by the family's name (autopar.core.op_families names them)
_PARTS = {f.name: f.rule.rsplit(".", 1) for f in FAMILIES}  # family -> (module, function)
MODULES = {m: importlib.import_module(f"{__name__}.{m}") for m, _ in _PARTS.values()}
RULES = {name: getattr(MODULES[m], fn) for name, (m, fn) in _PARTS.items()}
EMITTED = frozenset(op_kinds())  # the Node.op kinds some family owns: all a rule may emit


def apply(call: Call) -> Result:
    """Run the call's rule; any failure of the rule itself becomes an opaque node that says why."""
    rule = RULES.get(call.op, opaque.opaque)
    try:
        result = rule(call)
        _check(result, call)
    except Exception as e:  # a rule bug or an unforeseen argument form must not stop the trace
        call.fixed = {**call.fixed, "reason": f"rule {call.op!r} could not handle this call ({type(e).__name__}: {e})"}
        return opaque.opaque(call)
    unread = _unaccounted(result, call)
    if unread:  # codegen could not tell which operand such a tensor is: run the node whole
        call.fixed = {**call.fixed, "reason": f"rule {call.op!r} does not say how {call.target} reads "
                                              f"{', '.join(unread)}; replicated"}
        return opaque.opaque(call)
    return result


def _unaccounted(result: Result, call: Call) -> list[str]:
    """The call's tensor arguments that are neither an operand of the result nor a metadata read
    (a rule that reads ``x.view_as(y)``'s ``x`` and drops ``y``): codegen pairs a call's arguments
    with the node's operands by source, so a dropped tensor has no layout to take."""
    left = Counter((t.source, t.output) for t, _ in result.reads)
    metadata = {(t.source, t.output) for t in result.metadata_reads}
    missing = []
    for t in call.tensors():
        key = (t.source, t.output)
        if left[key] > 0:
            left[key] -= 1
        elif key not in metadata:
            missing.append(t.source or "a result")
    return missing


def _check(result: Result, call: Call) -> None:
    """A rule's axis maps must name its own dims and match the tensors' ranks."""
    if result.op not in EMITTED:
        raise ValueError(f"op {result.op!r} is owned by no family (autopar.core.op_families)")
    names = {d.name for d in result.dims}
    if len(names) != len(result.dims):
        raise ValueError(f"duplicate dim names {[d.name for d in result.dims]}")
    if len(result.out_axes) != len(call.outs):
        raise ValueError(f"{len(result.out_axes)} output maps for {len(call.outs)} outputs")
    for t, axes in list(result.reads) + list(zip(call.outs, result.out_axes)):
        if len(axes) != t.ndim:
            raise ValueError(f"axis map {axes} for shape {t.shape}")
        for axis in axes:
            if not set(axis) <= names:
                raise ValueError(f"axis map {axes} names unknown dims (dims: {sorted(names)})")


def build_node(name: str, module: str, call: Call) -> Node:
    """The ir.Node of one call: the rule's result, operands sorted into data inputs and params."""
    r = apply(call)
    inputs, params = [], []
    for t, axes in r.reads:
        op = Operand(t.source, t.output, TensorSpec(t.shape, t.dtype, tuple(axes)))
        (params if op.is_param else inputs).append(op)
    outputs = tuple(TensorSpec(t.shape, t.dtype, tuple(a)) for t, a in zip(call.outs, r.out_axes))
    attrs = dict(r.attrs)
    if r.metadata_reads:
        attrs[METADATA_READS] = tuple((t.source, t.output) for t in r.metadata_reads)
    read = r.bytes_read if r.bytes_read is not None else sum(o.spec.nbytes for o in inputs + params)
    written = r.bytes_written if r.bytes_written is not None else sum(o.nbytes for o in outputs)
    return Node(
        name=name, op=r.op, target=call.target, module=module, dims=tuple(r.dims), inputs=tuple(inputs),
        params=tuple(params), outputs=outputs, flops=int(r.flops), bytes_read=int(read), bytes_written=int(written),
        attrs=attrs, unsupported=r.unsupported,
    )


__all__ = ["EMITTED", "MODULES", "RULES", "Call", "Dim", "Result", "Tensor", "apply", "build_node"]
