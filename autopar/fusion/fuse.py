"""``fuse(models, example_inputs)``: K models of one architecture as one module (HFTA's idea,
done by an fx rewrite instead of by hand).

The fused module's parameters carry the K models' values model-major under the models' own
names (``fused.state_dict()["fc1.weight"].view(K, *shape)[k]`` is model k's ``fc1.weight``); its
forward takes the inputs all K models read (or, with ``inputs="stacked"``, one per model along
a leading dim) and returns the K models' outputs stacked, e.g. a (K,) tensor of losses. Summing
those losses gives every model its own gradients (no model reads another's parameters), so
``fused(x, y).sum().backward()`` then a per-model optimizer (``FusedAdamW``, ``FusedSGD``)
trains the K models exactly as K separate runs would, in one pass of fused kernels.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.fx as fx
import torch.nn as nn

from autopar.core.errors import TraceError
from autopar.fusion import nn_rules, rules
from autopar.fusion.rewrite import Rewriter
from autopar.fusion.trace import check_same, trace


class FusedModule(fx.GraphModule):
    """The fused graph module; ``k`` models; ``unfuse()`` gives each model's state back."""

    k: int
    inputs: str
    model_shapes: dict[str, tuple[int, ...]]  # one model's state: names and shapes
    concrete_shapes: bool

    def model_state_dict(self, index: int) -> dict[str, torch.Tensor]:
        """Model ``index``'s state dict (copies), under the original model's names."""
        if not 0 <= index < self.k:
            raise IndexError(f"model index {index} out of range for {self.k} fused models")
        state = self.state_dict()
        return {name: state[name].view((self.k,) + shape)[index].detach().clone()
                for name, shape in self.model_shapes.items()}

    def unfuse(self) -> list[dict[str, torch.Tensor]]:
        """The K models' state dicts, each under its model's own parameter and buffer names."""
        return [self.model_state_dict(i) for i in range(self.k)]

    def load_into(self, models: Sequence[nn.Module]) -> None:
        """Copy each model's trained state back into ``models`` (the K originals, in order)."""
        if len(models) != self.k:
            raise ValueError(f"load_into: {self.k} fused models, {len(models)} given")
        for m, state in zip(models, self.unfuse()):
            m.load_state_dict(state)


def fuse(models: Sequence[nn.Module], example_inputs, *, inputs: str = "shared") -> FusedModule:
    """Fuse K models whose graphs are equal up to parameter values into one module.

    ``example_inputs``: what one model's forward takes (used to trace and check the models).
    ``inputs``: "shared" (the fused forward takes one model's inputs, read by all K) or
    "stacked" (every tensor input has a leading dim of size K, model k's input at [k]).
    Raises ``TraceError`` naming the op or layer it cannot fuse, or how the models differ.
    """
    models = list(models)
    if not models:
        raise ValueError("fuse: no models given")
    if not all(isinstance(m, nn.Module) for m in models):
        raise TraceError("fuse: every model must be a torch.nn.Module")
    if inputs not in ("shared", "stacked"):
        raise ValueError(f"fuse: inputs must be 'shared' or 'stacked', not {inputs!r}")
    if len({id(m) for m in models}) != len(models):
        raise ValueError("fuse: the same model object is given twice; pass K distinct models (copy.deepcopy)")
    traced = trace(models[0], example_inputs)
    check_same(models, traced, example_inputs)
    gm = Rewriter(traced, models, inputs == "stacked", rules.call_rule, nn_rules.module_rule).run()
    fused = FusedModule(gm, gm.graph, gm.__class__.__name__)
    fused.k, fused.inputs, fused.concrete_shapes = len(models), inputs, traced.concrete_shapes
    fused.model_shapes = {name: tuple(t.shape) for name, t in models[0].state_dict().items()}
    fused.train(models[0].training)
    return fused
