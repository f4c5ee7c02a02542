"""The device mesh a compiled module runs on, on the devices its process group drives.

NCCL drives GPUs: the mesh is a "cuda" mesh and this rank's shards live on ``cuda:LOCAL_RANK``
(torchrun's convention); gloo drives CPUs: a "cpu" mesh, unless the model already sits on a GPU
(gloo carries CUDA tensors too), which keeps it there. Every ascending group of mesh dims gets
a flattened sub-mesh, so DTensor runs a redistribution over several axes as one collective
(what the cost model prices) and the gradient buckets of such a group have a process group.
"""

from __future__ import annotations

import itertools
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


def device_type(backend: str | None = None) -> str:
    """"cuda" for a process group on NCCL, else "cpu" (gloo)."""
    if backend is None:
        backend = dist.get_backend() if dist.is_initialized() else "gloo"
    return "cuda" if "nccl" in str(backend).lower() else "cpu"


def local_device(backend: str | None = None) -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` on NCCL (set as the current device), else the CPU."""
    if device_type(backend) == "cuda":
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def model_device_type(model) -> str | None:
    """"cuda" when the model's parameters are on a GPU (a gloo group can carry CUDA tensors), else None."""
    for p in list(model.parameters())[:1]:
        if p.device.type == "cuda":
            return "cuda"
    return None


def device_mesh(shape: tuple[int, ...], kind: str | None = None) -> DeviceMesh:
    """The plan's mesh over the process group; ``kind`` overrides the backend's device type."""
    kind = kind or device_type()
    if kind == "cuda" and device_type() == "cuda":
        local_device()
    mesh = init_device_mesh(kind, shape, mesh_dim_names=tuple(f"mesh{a}" for a in range(len(shape))))
    if mesh.ndim >= 2:
        names = mesh.mesh_dim_names
        for k in range(2, mesh.ndim + 1):
            for group in itertools.combinations(names, k):
                mesh[group]._flatten()
    return mesh
