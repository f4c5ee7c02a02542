"""Is the global batch the same on every rank? Checked once, at a module's first call.

With ``inputs="global"`` every rank passes the whole batch and keeps its slice. A script written
the DDP way (each rank loads its own batch) runs without error and trains on batches that differ
per rank: the ranks' replicated parameters drift apart with no word. A fingerprint of each input
(its sum, a position-weighted sum, and a few sampled values, in float64) taken to MAX over the
module's mesh, next to its negation, gives every rank the largest and the smallest fingerprint:
equal on every rank exactly when the batches agree (up to a collision of the fingerprint).

Cost: at the first call only, one read of each input in float64 and one all-reduce per mesh
dim of ``2 * (2 + SAMPLES)`` float64 numbers per input tensor (160 bytes for a one-input model);
later calls pay nothing.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

SAMPLES = 8  # values read at fixed, evenly spaced positions of each input


def fingerprint(t: torch.Tensor) -> torch.Tensor:
    """``[sum, position-weighted sum, SAMPLES values]`` of ``t`` in float64 (NaN as 0)."""
    flat = torch.nan_to_num(t.detach().reshape(-1).to(torch.float64))
    if flat.numel() == 0:
        return torch.zeros(2 + SAMPLES, dtype=torch.float64, device=t.device)
    weights = torch.arange(flat.numel(), device=flat.device, dtype=torch.float64).remainder_(7).add_(1)
    at = torch.linspace(0, flat.numel() - 1, SAMPLES, device=flat.device).long()
    return torch.cat([torch.stack([flat.sum(), (flat * weights).sum()]), flat[at]])


def differing_inputs(inputs: list[tuple[str, torch.Tensor]], mesh: DeviceMesh) -> list[str]:
    """The names of the inputs whose value differs between the ranks of ``mesh`` (the same list on
    every rank, so that all of them raise or none does). A collective: every rank must call it."""
    if not inputs or mesh.size() == 1:
        return []
    prints = torch.stack([fingerprint(t).to(inputs[0][1].device) for _, t in inputs])
    both = torch.cat([prints, -prints])
    for dim in range(mesh.ndim):
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=mesh.get_group(dim))
    high, low = both[:len(inputs)], -both[len(inputs):]
    same = torch.isclose(high, low, rtol=1e-9, atol=0.0).all(dim=1)
    return [name for (name, _), ok in zip(inputs, same.tolist()) if not ok]


def check_same_batch(inputs: list[tuple[str, torch.Tensor]], mesh: DeviceMesh) -> None:
    """ValueError (one line, on every rank) when the ranks passed different global batches."""
    differ = differing_inputs(inputs, mesh)
    if differ:
        raise ValueError(f"the ranks passed different values for input(s) {', '.join(map(repr, differ))}; "
                         "with inputs='global' every rank passes the same whole batch: pass it, or "
                         "compile with inputs='local' and give each rank its own slice "
                         "(module.data_parallel is the (replicas, rank) for a DistributedSampler)")
