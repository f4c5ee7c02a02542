"""Shape propagation on meta tensors: an fx graph run without allocating or reading any data.

Used by the fx frontend (every node's output shape) and by pipeline codegen (which values a stage
holds); it knows torch.fx, nothing of autopar.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch.func import functional_call


def to_meta(v: Any) -> Any:
    """A meta tensor with ``v``'s metadata: allocates nothing and never reads ``v``'s data."""
    return v.to("meta") if isinstance(v, torch.Tensor) else v


class MetaProp(fx.Interpreter):
    """Runs the traced graph on meta tensors; each leaf module on meta copies of its own state.

    Inputs must already be meta (``to_meta``); ``values`` holds every node's meta value."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm, garbage_collect_values=False)
        self.values: dict[fx.Node, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        self.values[n] = result
        return result

    def get_attr(self, target, args, kwargs):
        return to_meta(super().get_attr(target, args, kwargs))

    def call_module(self, target, args, kwargs):
        m = self.fetch_attr(target)
        state = {k: to_meta(v) for k, v in [*m.named_parameters(), *m.named_buffers()]}
        return functional_call(m, state, tuple(args), dict(kwargs), strict=False)
