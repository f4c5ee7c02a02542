"""Run one ``ir.Node``'s op on random tensors of its *local* shapes, and time it.

``build`` makes the op one device runs under a config with its family's runner
(``cost_models/runners.py``, chosen by ``node.op``); ``time_op`` times it forward and backward,
``time_optimizer`` an optimizer's update of local parameter shards. Ops without a runner raise
``NotRunnable``; the cost model then falls back to its estimate.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from autopar.core.ir import Node
from autopar.core.tables import Config
from autopar.cost_models.op_call import FLOAT, NotRunnable, OpCall, local_shape  # noqa: F401 (re-exported)
from autopar.cost_models.runners import RUNNERS


def build(node: Node, config: Config, device="cpu") -> OpCall:
    """The node's op on random local operands (inputs then params, in the node's order)."""
    if not node.outputs:
        raise NotRunnable("node has no outputs")
    run = RUNNERS.get(node.op)
    if run is None:
        raise NotRunnable(f"no runner for op {node.op!r}")
    return run(node, config, device)


def clock(device="cpu") -> Callable[[], float]:
    """The clock a timing reads: on a CPU running torch on one thread, this thread's CPU time.

    One thread means the op (forward and autograd's backward alike) runs on the calling thread,
    so its CPU time is its work on the core, including memory stalls, but not the time the OS
    gave the core to other processes: on a shared machine, wall time would charge each op for
    whatever else ran at the moment it was measured. GPUs and multi-threaded CPUs use wall time.
    """
    if torch.device(device).type == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _leaves(call: OpCall) -> list[torch.Tensor]:
    return [t for t in call.tensors if t.requires_grad] + list(call.params)


def _run_fb(call: OpCall, grads: list | None) -> None:
    out = call.fn(*call.tensors)
    outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,))
            if isinstance(o, torch.Tensor) and o.requires_grad]
    if grads is not None and outs:
        # autograd.grad, not backward: no .grad accumulation, which a real step would not time
        torch.autograd.grad(outs, _leaves(call), grads[: len(outs)], allow_unused=True)


def time_op(call: OpCall, backward: bool = True, repeats: int = 5, warmup: int = 2,
            device="cpu", now: Callable[[], float] | None = None) -> tuple[float, float | None]:
    """(median forward seconds, median backward seconds or None), each over ``repeats`` runs.

    Backward is timed as forward+backward minus forward (autograd cannot run a backward without
    its forward), clamped at zero. ``now``: the clock (default ``clock(device)``).
    """
    grads = None
    if backward and _leaves(call):
        out = call.fn(*call.tensors)
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,))
                if isinstance(o, torch.Tensor) and o.requires_grad]
        grads = [torch.randn_like(o) for o in outs] if outs else None

    now = now or clock(device)

    def timed(f) -> float:
        for _ in range(warmup):
            f()
        _sync(device)
        ts = []
        for _ in range(repeats):
            t = now()
            f()
            _sync(device)
            ts.append(now() - t)
        return statistics.median(ts)

    fwd = timed(lambda: _run_fb(call, None))
    if grads is None:
        return fwd, (0.0 if backward else None)
    fb = timed(lambda: _run_fb(call, grads))
    return fwd, max(fb - fwd, 0.0)


OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}


EVICT_BYTES = 64 * 2**20  # written before each timed CPU update: twice the benchmark machine's L3 (32 MiB)


def time_optimizer(name: str, shapes: list[tuple[tuple[int, ...], str]], repeats: int = 5,
                   warmup: int = 2, device="cpu", evict: torch.Tensor | None = None,
                   now: Callable[[], float] | None = None, sync: Callable[[], None] | None = None) -> float:
    """Median seconds of one ``torch.optim`` update of parameters of these local shapes.

    The optimizer is built as the generated module's ``optimizer()`` builds it (``foreach=True``:
    on a CPU torch's default is its per-tensor loop, 13.2 ms against foreach's 10.1 ms for the
    zoo mlp's AdamW here), gradients are set, and its state is created by the warm-up steps, so
    only the steady-state update is timed. With ``evict`` (a buffer of ``EVICT_BYTES``, made once
    by the caller) each timed update starts cold: in a step the rest of the model's update and the
    backward have gone through the caches since this node's state was last touched, and an update
    timed hot, again and again on a few MiB, is the cache's speed (the zoo mlp's nodes summed:
    5.8 ms hot, 8.2 ms cold, 10.8 ms for the whole model's update in one optimizer). ``now``: the
    clock (default ``clock(device)``). ``sync``: called before each timed update, after the
    eviction (a barrier, where several ranks time their updates at once: each reading then meets
    the others' updates, not their set-up or their evictions).
    """
    if name not in OPTIMIZERS:
        raise NotRunnable(f"optimizer {name!r} unknown to the runner (know {', '.join(OPTIMIZERS)})")
    params = []
    for shape, dtype in shapes:
        p = torch.randn(shape, dtype=getattr(torch, dtype), device=device, requires_grad=True)
        p.grad = torch.randn_like(p)
        params.append(p)
    opt = getattr(torch.optim, OPTIMIZERS[name])(params, lr=1e-3, foreach=True)
    for _ in range(max(1, warmup)):
        opt.step()
    _sync(device)
    now = now or clock(device)
    ts = []
    for _ in range(repeats):
        if evict is not None:
            evict.fill_(1.0)  # the caches hold something else, as in a step
        if sync is not None:
            sync()
        t = now()
        opt.step()
        _sync(device)
        ts.append(now() - t)
    return statistics.median(ts)
