"""The optimizer's update as the hierarchical pricing and a pipeline stage's compute count it where
it runs as torch's own ops (``foreach``), against the bytes torch's update reads and writes.

Every op of torch's element-wise optimizers is a full pass over whole tensors; the bytes each op
of a real ``step()`` reads (its tensor operands) and writes (its outputs; an in-place op its first
operand) are counted here with a dispatch mode, independently of the pricing's table.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from autopar.cost_models.memory import optimizer_states
from autopar.cost_models.training import optimizer_step_time

ELEMENTS = 4096  # per parameter; two parameters


class BytesMoved(TorchDispatchMode):
    """Bytes every op reads and writes (tensors of more than one element: no step counters)."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))

        def big(ts):
            return [t for t in ts if isinstance(t, torch.Tensor) and t.numel() > 1]

        read = big(tree_leaves((args, kwargs)))
        if func.overloadpacket.__name__.endswith("_"):  # in place: writes its first operand(s)
            written = big(args[0] if isinstance(args[0], (list, tuple)) else [args[0]])
        else:
            written = big(tree_leaves(out))
        self.bytes += sum(t.numel() * t.element_size() for t in read + written)
        return out


def counted_bytes_per_element(name: str, **kwargs) -> float:
    params = [torch.randn(ELEMENTS, requires_grad=True) for _ in range(2)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = getattr(torch.optim, name)(params, lr=1e-3, foreach=True, **kwargs)
    opt.step()  # the state exists: the steady update is counted
    mode = BytesMoved()
    with mode:
        opt.step()
    return mode.bytes / (2 * ELEMENTS)


@pytest.mark.parametrize("name,kind,kwargs", [("AdamW", "adamw", {}), ("SGD", "momentum", {"momentum": 0.9}),
                                              ("SGD", "plain_sgd", {})])
def test_the_update_is_priced_at_the_bytes_torchs_update_moves(name, kind, kwargs):
    bw, eff = 1e9, 0.8
    priced = optimizer_step_time(1.0, 4, optimizer_states(kind), False, bw, eff, foreach=True) * bw * eff
    assert priced == pytest.approx(counted_bytes_per_element(name, **kwargs))


def test_adam_is_priced_as_adamw_at_most_a_little_high():
    priced = optimizer_step_time(1.0, 4, optimizer_states("adam"), False, 1.0, 1.0, foreach=True)
    counted = counted_bytes_per_element("Adam")
    assert counted <= priced <= 1.11 * counted


def update_peak_bytes(name: str, **kwargs) -> int:
    """Bytes torch's foreach update allocates above what exists when it starts (its peak), read
    off the allocator's events (``torch.profiler`` with ``profile_memory``)."""
    params = [torch.randn(ELEMENTS, requires_grad=True) for _ in range(2)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = getattr(torch.optim, name)(params, lr=1e-3, foreach=True, **kwargs)
    opt.step()  # the state exists: the steady update is measured
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        opt.step()
    running, peak = 0, 0
    for at, nbytes in sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                             if e.name() == "[memory]"):
        running += nbytes
        peak = max(peak, running)
    return peak


@pytest.mark.parametrize("name,kind,kwargs", [("AdamW", "adamw", {}), ("Adam", "adam", {}),
                                              ("SGD", "momentum", {"momentum": 0.9}), ("SGD", "plain_sgd", {})])
def test_the_updates_buffers_are_what_torchs_update_allocates(name, kind, kwargs):
    from autopar.cost_models.training import update_working_set

    counted = update_peak_bytes(name, **kwargs)
    assert update_working_set(2 * ELEMENTS, optimizer_states(kind), foreach=True) == pytest.approx(counted, abs=64)
    assert update_working_set(2 * ELEMENTS, optimizer_states(kind), foreach=False) == 0  # a fused kernel
