"""What a reshard step costs a rank beyond its collective, measured: the runtime's path per call
and the local copy of the collective's buffer (``Cluster.move_call``, ``copy_time``,
``strided_copy_time``; priced by ``alpha_beta.reshard_local``).

The collective fit (``collective_fit``) times the bare c10d call on a buffer it reuses. A step's
reshard is more: the runtime's move (``codegen/moves.py``, inside an autograd function) looks up
the mesh axis's group, rank and size, checks the placements, and copies the buffer once around
the collective (an all-reduce clones its input; a gather of a non-leading dim puts the ranks'
blocks side by side; a reduce-scatter stacks them first), and its gradient's move in the backward
does the same. On 2 gloo processes (the benchmarks' machine, thread CPU time, medians) a 1 MiB
gather of dim 2 cost the calling thread 0.29 ms where the bare all-gather cost 0.08 and a plain
copy of 1 MiB 0.11; the runtime's gather of dim 0, which copies nothing, 0.20; the zoo gpt's
reshard-heavy plans spent 0.22 ms of CPU per move outside the collective.

Measured here on the live group, every rank together: the copies on this device at a few sizes
(thread CPU time on one CPU thread, as the profile times ops; a line fitted for seconds per byte),
and, given the runtime's reshard as ``probe`` (the cost models do not import the code
generator: the caller passes it), one small reshard through it less the bare collective it runs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

# the bytes the copies are timed at: the activations a step reshards (a few hundred KiB to MiB)
COPY_SIZES = (2 ** 16, 2 ** 18, 2 ** 20, 2 ** 22)
# the gathered bytes the runtime's path is timed at (``_call``)
CALL_SIZES = (2 ** 16, 2 ** 20, 2 ** 22)
# floats per contiguous run of a strided copy: one rank's block of a split feature dim
BLOCK = 128


@dataclass(frozen=True)
class MoveFit:
    """``call``: seconds per reshard step beyond its collective (0: no probe, or none measured);
    ``copy``, ``strided``: seconds per byte of a plain and of a strided (block) copy."""

    call: float
    copy: float
    strided: float


def fit_moves(probe=None, device: str = "cpu", sizes=COPY_SIZES, repeats: int = 9) -> MoveFit | None:
    """Fit ``MoveFit`` on the live process group (None without one); every rank must call it.

    ``probe(mesh)``: a function of a tensor (this rank's Shard(0) block on a 1-D ``mesh`` over
    all ranks) that gathers it to a replica through the runtime's reshard. The figures are
    all-reduced with MAX, so that all ranks price plans alike.
    """
    import torch
    import torch.distributed as dist

    from autopar.cost_models.collective_fit import fit_line

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    p = dist.get_world_size()
    threads = torch.get_num_threads()
    cpu = torch.device(device).type == "cpu"
    if cpu:
        torch.set_num_threads(1)  # one device = one core's worth, as the profile times ops
    try:
        plain, strided = [], []
        evict = _evictor(device)
        for n in sizes:
            rows = max(1, n // (4 * p * BLOCK))
            x = torch.randn(p, rows, BLOCK, device=device)
            plain.append(_median(lambda: x.clone(), repeats, device, evict))
            strided.append(_median(lambda: x.movedim(0, 1).contiguous(), repeats, device, evict))
        xs = [4.0 * p * max(1, n // (4 * p * BLOCK)) * BLOCK for n in sizes]
        copy, strid = fit_line(xs, plain)[1], fit_line(xs, strided)[1]
        call, per_byte = _call(probe, p, device, repeats) if probe is not None else (0.0, 0.0)
        copy, strid = copy + per_byte, strid + per_byte
    finally:
        if cpu:
            torch.set_num_threads(threads)
    fit = torch.tensor([call, copy, strid], dtype=torch.float64, device=device)
    dist.all_reduce(fit, op=dist.ReduceOp.MAX)
    return MoveFit(*(float(v) for v in fit))


def _sync(device: str) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _evictor(device: str):
    """A function that runs the caches through other memory (nothing on a GPU): in a step the
    reshard's buffers meet the caches after the ops around it have passed through them, and a
    copy timed again and again on the same MiB is the cache's speed (on the benchmarks' machine
    a 1 MiB clone took 28 us hot, 113 us between a step's other work)."""
    import torch

    from autopar.cost_models.op_runner import EVICT_BYTES

    if torch.device(device).type != "cpu":
        return lambda: None
    buf = torch.empty(EVICT_BYTES // 4)
    return lambda: buf.fill_(1.0)


def _median(f, repeats: int, device: str, before=lambda: None) -> float:
    from autopar.cost_models.op_runner import clock

    now = clock(device)
    for _ in range(2):
        f()
    ts = []
    for _ in range(repeats):
        before()
        _sync(device)
        t = now()
        f()
        _sync(device)
        ts.append(now() - t)
    return statistics.median(ts)


def _call(probe, p: int, device: str, repeats: int) -> tuple[float, float]:
    """The probe's reshard less the bare all-gather it runs, as a line in the gathered bytes
    (``CALL_SIZES``): at 0 bytes the path's calls, per byte what it adds besides a copy (its
    result allocated and first touched: on the benchmarks' machine the runtime's gather of dim 0,
    which copies nothing, cost 0.14 ms more than the bare call at 256 KiB and 0.16 at 4 MiB, its
    autograd function 0.19 and 0.29). Medians of interleaved calls, each started on every rank
    together."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from autopar.cost_models.collective_fit import fit_line
    from autopar.cost_models.op_runner import clock

    mesh = DeviceMesh.from_group(dist.group.WORLD, torch.device(device).type)
    run = probe(mesh)
    now = clock(device)
    xs, extra = [], []
    for n in CALL_SIZES:
        x = torch.randn(max(1, n // (4 * p * BLOCK)), BLOCK, device=device, requires_grad=True)
        out = torch.empty(p * x.numel(), device=device)
        part = x.detach().reshape(-1)
        calls = {"probe": lambda: run(x), "bare": lambda: dist.all_gather_single(out, part)}
        ts: dict[str, list[float]] = {k: [] for k in calls}
        for r in range(2 + repeats):
            for k, f in calls.items():
                dist.barrier()
                _sync(device)
                t = now()
                f()
                _sync(device)
                if r >= 2:
                    ts[k].append(now() - t)
        xs.append(4.0 * p * x.numel())
        extra.append(max(1e-9, statistics.median(ts["probe"]) - statistics.median(ts["bare"])))
    return fit_line(xs, extra)
