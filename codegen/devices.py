"""Tensors a forward makes (``torch.ones(t, t, device=x.device)``, ``torch.arange(t)``) are made
on the rank's device when the program runs, whatever device the trace saw.

The trace runs on meta tensors (torch.fx's shape propagation) or on the example inputs' device
(torch.export records ``device=cpu`` in every ATen factory), so a device in a traced call is the
trace's, not the run's: a mask made on ``meta`` failed the first ``masked_fill`` of a CPU rank,
and one made on the CPU would fail a GPU rank. Every ``torch.device`` the program passes becomes
the rank's, a factory called without one is given it, and a tensor constant recorded at trace
time is copied onto it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch.distributed.device_mesh import DeviceMesh
from torch.utils import _pytree as pytree

# torch functions that make a tensor from sizes or values and take ``device=`` (fx records the
# function itself; torch.export records ATen overloads, whose schema says whether they take one)
FACTORY_NAMES = frozenset(("zeros", "ones", "full", "empty", "arange", "rand", "randn", "randint", "randperm",
                           "eye", "linspace", "logspace", "tensor", "as_tensor", "scalar_tensor", "empty_strided"))


def rank_device(mesh: DeviceMesh) -> torch.device:
    """The device this rank's shards live on: the current GPU of a "cuda" mesh, else the mesh's type."""
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(mesh.device_type)


def on_device(value: Any, device: torch.device) -> Any:
    """``value`` (a call's arguments, a traced constant) with every ``torch.device`` in it ``device``."""
    return pytree.tree_map(lambda v: device if isinstance(v, torch.device) else v, value)


def makes_on_device(n: fx.Node, args: tuple, kwargs: dict, device: torch.device) -> tuple[tuple, dict]:
    """The call of node ``n`` with its devices made ``device``; a factory that names no device
    (which would make its tensor on the default device, the CPU) is given ``device=``."""
    args, kwargs = on_device((tuple(args), dict(kwargs)), device)
    if "device" not in kwargs and _takes_device(n) and not _tensor_in(args):
        kwargs["device"] = device
    return args, kwargs


def constant_on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A tensor recorded at trace time, as the program's own copy on ``device``."""
    return t.detach().to(device, copy=True)


def _takes_device(n: fx.Node) -> bool:
    if n.op != "call_function":
        return False
    target = n.target
    if isinstance(target, torch._ops.OpOverload):
        return any(a.name == "device" and a.kwarg_only for a in target._schema.arguments)
    return getattr(target, "__module__", "") == "torch" and getattr(target, "__name__", "") in FACTORY_NAMES


def _tensor_in(args) -> bool:
    return any(isinstance(a, (torch.Tensor, fx.Node)) for a in pytree.tree_leaves(args))
