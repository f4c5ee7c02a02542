"""The communication inside a measured step, timed apart so that compute is compared with compute.

A plan prices a step as compute (each node's forward, backward and update) plus communication
(its reshards, the gradient sync, the loss's all-reduce), and ``autopar measure`` compares the
compute. On torch's fake process group a collective moves nothing between processes, but it is not
free on this rank: the fake all-gather copies its input into every slot of its output, and a
reshard does its local part around the collective (the slices, the copy that stacks the blocks,
the clone before an all-reduce, the replicate -> shard slice that needs no collective at all); the
gradient buckets copy every gradient in and wrap the reduced ones back as DTensor gradients. All of
that is what the plan's communication terms price (the reshard's time on the links, the bucketed
sync), so it counts there, not in compute: the zoo gpt's 64-device plan spent 13-15 of its
80-87 ms a step in it.

``comm_timed(now)`` times, on the clock ``now``, everything the generated program runs as
communication while it is active: codegen's moves (``autopar.codegen.runtime.move``: a reshard's
forward and its gradient's move back, the input slices), the gradient reducer's bucket launch and
finish, every ``torch.distributed`` collective called directly (ZeRO's gathers, the loss's count,
the pipeline's broadcast of the loss), and the code ``CommTime.section`` wraps (a pipeline stage's
receive buffers). It does so by wrapping those functions for its duration and restoring them
after (one thread: measure steps on the calling thread); a call inside another is counted once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

# the collectives codegen calls through ``torch.distributed`` (the moves' own calls are inside a move)
COLLECTIVES = ("all_reduce", "all_gather_single", "reduce_scatter_single", "all_gather_into_tensor",
               "reduce_scatter_tensor", "all_gather", "broadcast", "all_to_all_single", "send", "recv",
               "isend", "irecv", "batch_isend_irecv")


@dataclass
class CommTime:
    """Seconds (on the clock given) and calls of communication since it was made."""

    now: Callable[[], float]
    sync: Callable[[], None] | None = None  # CUDA: wait for the device at each end of a section
    seconds: float = 0.0
    calls: dict[str, int] = field(default_factory=dict)
    _depth: int = 0

    @contextmanager
    def section(self, label: str) -> Iterator[None]:
        """Count the time of the ``with`` body as communication (nested sections once)."""
        self.calls[label] = self.calls.get(label, 0) + 1
        if self._depth:
            yield
            return
        self._depth += 1
        if self.sync is not None:
            self.sync()
        t0 = self.now()
        try:
            yield
        finally:
            if self.sync is not None:
                self.sync()
            self.seconds += self.now() - t0
            self._depth -= 1

    def wrapping(self, f: Callable, label: str) -> Callable:
        @functools.wraps(f)
        def timed(*args, **kwargs):
            with self.section(label):
                return f(*args, **kwargs)

        return timed


@contextmanager
def comm_timed(now: Callable[[], float], sync: Callable[[], None] | None = None) -> Iterator[CommTime]:
    """A ``CommTime`` that counts the generated program's communication while the block runs."""
    import torch.distributed as dist

    from autopar.cli import measure_stage
    from autopar.codegen import runtime

    comm = CommTime(now, sync)
    patched = [(runtime, "move"), (runtime.GradReducer, "_launch"), (runtime.GradReducer, "_finish"),
               (measure_stage, "receive"), (measure_stage, "receive_grads")]
    patched += [(dist, name) for name in COLLECTIVES if hasattr(dist, name)]
    saved = [(owner, name, owner.__dict__[name]) for owner, name in patched]
    try:
        for owner, name, f in saved:
            wrapped = comm.wrapping(getattr(owner, name), name.strip("_"))
            setattr(owner, name, wrapped)
        yield comm
    finally:
        for owner, name, f in saved:
            setattr(owner, name, f)
