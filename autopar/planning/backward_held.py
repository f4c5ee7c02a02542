"""What a pipeline rank's backward holds beside its saved activations and its static state.

* The outputs of each of its stages but the last, kept for the backward of every microbatch in
  flight (torch's schedule calls the backward on a stage's outputs, so it keeps them from the
  microbatch's forward to its backward), in the layout the stage sends them (codegen's
  ``Boundary``), and the gradient received for them while that backward runs.
* How far one node's gradients rise above what is saved up to it (``UnitStats.backward``,
  ``cost_models/backward_set.py``): an attention whose heads are whole on every rank of its
  tensor group makes whole gradients of its query, key and value. Counted on the ranks of a
  pipeline that hold no loss: one whose backward starts at a loss has its peak there, with every
  activation alive and the loss's working set (``UnitStats.transient``, in its static state), as
  a single-stage plan's is priced on both paths.
"""

from __future__ import annotations

import numpy as np

from autopar.planning.units import UnitStats


def beside_saved(s: UnitStats, ranks: list[list[tuple[int, int]]], held: list[float]) -> list[float]:
    """Per rank (its stages' unit spans ``ranks[r]``, ``held[r]`` microbatches in flight: the
    pricing's ``in_flight``), the bytes its backward holds beside the saved activations."""
    U = len(s.spans)
    out = []
    for r, spans in enumerate(ranks):
        each = held[r] / len(spans) + 1.0  # the outputs in flight, and the gradient received for one
        sent = sum(float(s.sent[y - 1]) * each for _, y in spans if y < U) if s.sent is not None else 0.0
        rise = max((float(np.max(s.backward[x:y])) for x, y in spans), default=0.0) if s.backward is not None else 0.0
        loss = sum(float(np.sum(s.transient[x:y])) for x, y in spans) if s.transient is not None else 0.0
        out.append(sent + (rise if loss == 0 and len(ranks) > 1 else 0.0))
    return out
