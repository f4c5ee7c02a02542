"""The mesh follows the process group's backend: NCCL drives GPUs ("cuda"), gloo CPUs ("cpu").

The GPU side runs on the device machine (see the issue notes); here the choice itself, which
is what decides where every shard lives."""

import pytest
import torch

from autopar.codegen.mesh import device_type, local_device


@pytest.mark.parametrize("backend,kind", [("nccl", "cuda"), ("NCCL", "cuda"), ("gloo", "cpu"),
                                          ("cpu:gloo,cuda:nccl", "cuda"), (None, "cpu")])
def test_mesh_device_type_follows_the_backend(backend, kind):
    assert device_type(backend) == kind


def test_gloo_ranks_keep_their_shards_on_the_cpu(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert local_device("gloo") == torch.device("cpu")


def test_nccl_ranks_use_their_local_rank_s_gpu(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: chosen.append(i))
    assert local_device("nccl") == torch.device("cuda", 3)
    assert chosen == [3]  # and it becomes the current device, as torchrun scripts expect


def test_a_model_already_on_a_gpu_keeps_its_shards_there():
    from autopar.codegen.mesh import model_device_type

    cpu = torch.nn.Linear(2, 2)
    assert model_device_type(cpu) is None
    meta = torch.nn.Linear(2, 2, device="meta")
    assert model_device_type(meta) is None
    # the choice reads the first parameter's device type; a cuda one is what keeps the mesh on cuda
    fake = type("P", (), {"device": torch.device("cuda", 0)})()
    holder = type("M", (), {"parameters": lambda self: iter([fake])})()
    assert model_device_type(holder) == "cuda"
