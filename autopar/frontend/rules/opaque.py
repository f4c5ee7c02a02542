"""The rule for anything without one: replicate the node, and say why.

No dim, every axis ``()``: later stages can only replicate it, and ``graph.unsupported`` lists it
so a user sees what autopar did not understand instead of a crash.
"""

from __future__ import annotations

from autopar.frontend.rules.base import Call, Result


def opaque(call: Call) -> Result:
    reason = call.fixed.get("reason") or f"no split rule for {call.target}"
    reads = [(t, ((),) * t.ndim) for t in call.tensors()]
    outs = [((),) * t.ndim for t in call.outs]
    return Result("opaque", [], reads, outs, 0, {}, unsupported=reason)
