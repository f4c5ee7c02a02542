"""How much slower the ranks compute in their run than the profile timed: the model's own ops,
re-timed on every rank at once on the live group, against their cached timings.

The profile times each op in one process (often another one, minutes or days before the run), on
that thread's CPU clock. The ranks of a run compute at once on the host's cores, sharing its
memory bus and last-level cache with each other and with whatever else the host runs at that
moment, so the same op can take longer on a rank's CPU clock than it did in the profile: on the
benchmarks' machine (benchmarks/README.md) every plan of the zoo mlp, the replicated one (no
communication) included, measured 1.09-1.33x its profiled prediction in some invocations of
``benchmarks/cost_vs_measured.py`` and 0.9-1.1x in others, while ``compute_share``'s matmul
segment, timed alone and together in cache, read 1.00 in all of them.

The reference here is the model itself: its nodes under the unsplit config (the replicated plan's
ops, each signature once, weighted by how many nodes run it), the most expensive of them covering
``COVER`` of its profiled forward and backward, re-timed by the same op runner on every rank at
once (each rank the same ops in the same order, after a barrier), on the wall clock, as a step is
timed: where ranks outnumber the cores each runs part of the time (4 ranks on 2 cores: about half),
which the profile's CPU clock does not count (``compute_share``'s segment is on the wall clock for
the same reason). Their sum over the cached sum is this run's compute scale; the slowest rank's (a
step waits for it) is taken, all-reduced so that every rank prices alike. It is a measurement of
this run's conditions, not a constant: where the host runs the ranks as the profile ran, it reads
about 1.
"""

from __future__ import annotations

import math

COVER = 0.9  # share of the model's profiled compute the re-timed ops cover


def reference_ops(graph, mesh, op_signature) -> list[tuple[object, object, int, str]]:
    """(node, its unsplit config on ``mesh``, how many nodes share its op signature, that
    signature: the profile cache's key, ``op_signature(node, config)``), one per signature, in
    graph order."""
    from autopar.core.layout import to_mesh
    from autopar.core.space import configs_for

    out: dict[str, list] = {}
    for n in graph.nodes:
        whole = next((c for c in configs_for(n, mesh, "mesh") if c.devices == 1), None)
        m = to_mesh(whole, mesh) if whole is not None else None
        if m is None:
            continue
        sig = op_signature(n, m)
        if sig in out:
            out[sig][2] += 1
        else:
            out[sig] = [n, m, 1, sig]
    return [tuple(v) for v in out.values()]


def run_share(model, ops, cover: float = COVER) -> float | None:
    """The live group's compute scale against ``model``'s cache (see the module's docstring);
    None without a group of two or more ranks or without cached timings of ``ops``. Every rank
    must call it, with the same ``ops``."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    cached = []
    for node, config, count, sig in ops:
        t = model.cache.get(model._device, model._torch, sig)
        if t is not None and not t.error:
            cached.append((count * (t.forward + (t.backward or 0.0)), node, config, count))
    cached.sort(key=lambda x: -x[0])
    total = sum(x[0] for x in cached)
    picked, covered = [], 0.0
    for x in cached:
        if covered >= cover * total:
            break
        picked.append(x)
        covered += x[0]
    now = _retimed(model, [(node, config, count) for _, node, config, count in picked])
    ratio = now / covered if covered > 0 and now > 0 else 0.0
    x = torch.tensor([ratio], dtype=torch.float64, device=model.device)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    ratio = float(x[0])
    return ratio if ratio > 0 and math.isfinite(ratio) else None


def _retimed(model, ops) -> float:
    """Seconds of ``ops`` (each times its count, forward and backward) timed as the profile times
    them (one thread, ``model.repeats`` runs, the median) but on the wall clock: a step's time is
    wall time, and where ranks outnumber the cores each runs part of the time, which the thread's
    CPU clock the profile reads does not count. Every rank starts together (a barrier)."""
    import time

    import torch
    import torch.distributed as dist
    from autopar.cost_models.op_runner import build, time_op

    threads = torch.get_num_threads()
    cpu = torch.device(model.device).type == "cpu"
    if cpu:
        torch.set_num_threads(1)
    total = 0.0
    try:
        dist.barrier()
        for node, config, count in ops:
            try:
                fwd, bwd = time_op(build(node, config, model.device), True, model.repeats, model.warmup,
                                   model.device, now=time.perf_counter)
            except Exception:  # an op the runner cannot rebuild here: left out of both sums alike
                return 0.0
            total += count * (fwd + (bwd or 0.0))
    finally:
        if cpu:
            torch.set_num_threads(threads)
    return total
