"""In-place calls (``x.relu_()``, ``nn.ReLU(inplace=True)``, ``F.relu(x, inplace=True)``).

The sharded module runs every node through ``local_map``, whose local inputs are views made by a
custom autograd Function: autograd forbids writing into them. So an in-place call runs out of
place on a copy of the tensor it writes into, and the runner then binds that fx argument to the
result, so every later reader sees the written value, as in eager mode (the functionalization
torch.export performs, done at the interpreter; gradients are those of the functional program,
which are eager's).
"""

from __future__ import annotations

import operator

import torch.fx as fx
import torch.nn as nn

_AUGMENTED = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
              operator.ipow, operator.imod, operator.iand, operator.ior, operator.ixor}


def written_argument(n: fx.Node, module: nn.Module | None = None) -> fx.Node | None:
    """The fx node whose tensor the call ``n`` writes into (its first argument), or None."""
    first = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
    if first is None:
        return None
    if n.op == "call_method":
        return first if n.target.endswith("_") and not n.target.endswith("__") else None
    if n.op == "call_function":
        name = getattr(n.target, "__name__", "")
        if n.kwargs.get("inplace") is True or n.target in _AUGMENTED:
            return first
        return first if name.endswith("_") and not name.startswith("_") else None
    if n.op == "call_module":
        return first if getattr(module, "inplace", False) is True else None
    return None
