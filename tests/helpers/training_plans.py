"""The small GPT and its two plans the training-option tests (recomputation, ZeRO, bf16) share.

Plain data parallelism on every device, and on 4 devices data parallelism over mesh axis 0 times
the planner's 2-device Megatron plan over axis 1 (ZeRO then slices over axis 0 only, and the
gradients of replicated weights also sum over axis 1).
"""

from __future__ import annotations

import dataclasses

import torch

import autopar
from autopar.core.batch import batch_dims
from autopar.core.cluster import Cluster
from autopar.core.tables import Config

SIZES = dict(batch=4, seq=8, width=16, heads=2, layers=2, vocab=32)


def gpt(dtype=torch.float64):
    model, inputs = autopar.zoo.get("gpt", **SIZES)
    return model.to(dtype), inputs


def make_plans(world: int) -> dict[str, dict]:
    """{"dp": ..., "hybrid" (4 devices only): ...} as plan JSON documents (they pickle to ranks)."""
    model, inputs = gpt(torch.float32)
    plans = autopar.plan(model, inputs, Cluster(devices=world), precision="fp32").baselines
    out = {"dp": plans["data_parallel"]}
    if world == 4:  # axis 0: the batch; axis 1: the 2-device Megatron plan
        graph = autopar.trace(model, inputs)
        expert = autopar.plan(model, inputs, Cluster(devices=2)).baselines["expert"].assignment
        batch = batch_dims(graph)
        assignment = {}
        for node in graph.nodes:
            c = expert[node.name]
            splits = list(c.splits)
            axes = [tuple(a + 1 for a in ax) for ax in c.mesh_axes]
            names = [d.name for d in node.dims]
            if batch.get(node.name) in names:
                i = names.index(batch[node.name])
                splits[i] *= 2
                axes[i] = (0,) + axes[i]
            assignment[node.name] = Config(tuple(splits), tuple(axes))
        out["hybrid"] = dataclasses.replace(plans["data_parallel"], assignment=assignment, baselines={})
    return {k: p.to_json() for k, p in out.items()}


def adamw_on_one_device(steps: int, lr: float):
    """The single-device reference: the float64 gpt after ``steps`` AdamW steps on its inputs,
    returned with its inputs (model, inputs)."""
    model, inputs = gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        model(*inputs).backward()
        opt.step()
    return model, inputs
