"""Shape propagation on meta tensors: an fx graph run without allocating or reading any data.

Used by the fx frontend (every node's output shape) and by pipeline codegen (which values a stage
holds); it knows torch.fx, nothing of autopar.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.fx as fx
from torch.func import functional_call


# functional_call swaps a leaf module's tensors while it runs: two propagations over modules shared
# between threads (ranks of a threaded process group) must not interleave.
_SWAP_LOCK = threading.RLock()


def exclusive():
    """Hold while copying a model that a propagation elsewhere may be running over (threads)."""
    return _SWAP_LOCK


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

    def run(self, *args, **kwargs):
        with _SWAP_LOCK:
            return super().run(*args, **kwargs)

    def call_function(self, target, args, kwargs):
        # a device written into the graph (torch.export's ``aten.to.device(x, cpu)``, ``arange(...,
        # device=cpu)``) is the example's: on meta values it would copy out of a meta tensor or
        # allocate a real one, so every torch.device argument reads as meta
        args, kwargs = fx.node.map_aggregate((args, kwargs), _meta_device)
        return super().call_function(target, args, kwargs)

    def call_module(self, target, args, kwargs):
        m = self.fetch_attr(target)
        state = {k: to_meta(v) for k, v in [*m.named_parameters(), *m.named_buffers()]}
        return functional_call(m, state, tuple(args), dict(kwargs), strict=False)


def meta_like(t: torch.Tensor) -> torch.Tensor:
    """An empty meta tensor of ``t``'s global shape and dtype (a DTensor's whole shape)."""
    return torch.empty(tuple(t.shape), dtype=t.dtype, device="meta")


def _meta_device(v: Any) -> Any:
    return torch.device("meta") if isinstance(v, torch.device) else v
