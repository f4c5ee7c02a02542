"""What building a rank's program gives its caller (``program.build``): the program and what it
must be fed, kept apart from the builder so that the module that runs it reads only this."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from torch import fx

from .placements import NodeLayout, Placements


@dataclass
class Boundary:
    """What a pipeline stage of several devices receives and sends, as this rank's local shards:
    per received input its layout on the stage's sub-mesh, per sent output leaf the layout it
    leaves in (None: the stage sends nothing, its outputs leave as ``outputs=`` says)."""

    inputs: dict[str, Placements] = field(default_factory=dict)
    outputs: list[Placements] | None = None

    def send(self, placements: list):
        """How the next output leaf leaves (appended to ``placements``): in its sent layout, its
        gradient coming back whole where the layout is a partial sum (``runtime.grad_target``)."""
        from .operands import Use
        from .runtime import grad_target

        want = self.outputs[len(placements)]
        placements.append(want)
        return Use(want, grad_target(want))


@dataclass
class Program:
    """The built program and what its caller must feed it."""

    module: fx.GraphModule
    state: list[str]  # qualified names of the parameters/buffers fed first, in placeholder order
    inputs: list[str]  # the user's inputs (the forward's argument names), after the state, in order
    input_specs: dict[str, Any] = field(default_factory=dict)  # input name -> its traced TensorSpec
    stored: dict[str, Placements] = field(default_factory=dict)  # how each is stored (first reader's layout)
    reduce_axes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # param -> axes its grad sums over
    sync_bn: set[str] = field(default_factory=set)  # parameters a synced batch norm reads itself
    layouts: dict[str, NodeLayout] = field(default_factory=dict)
    output_placements: list = field(default_factory=list)  # per output leaf (fx order): placements or None
    input_placements: dict[str, Placements] = field(default_factory=dict)  # inputs="local": each input's slice
    output_reshards: list = field(default_factory=list)  # the OutputReshard modules of ``module``
    boundary: Boundary = field(default_factory=Boundary)  # a pipeline stage's local inputs and outputs
    held_experts: list = field(default_factory=list)  # cut expert lists' weights (expert_weights.HeldExpert)

    @contextlib.contextmanager
    def outputs_deferred(self):
        """Within: the program returns its outputs as this rank holds them (no output reshard);
        yields the list of (output leaf, returned tensor, ``ReshardSpec``) of each reshard left
        undone (the leaf: its index among the outputs' tensors, ``fx.node.map_aggregate`` order)."""
        undone: list = []
        reshards = self.output_reshards
        for m in reshards:
            m.deferred = undone
        try:
            yield undone
        finally:
            for m in reshards:
                m.deferred = None
