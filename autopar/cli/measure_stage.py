"""One rank of a pipelined plan: its stage's module, run in this process in the schedule's order.

A stage built by codegen runs under torch's pipelining schedule, which learns the shapes of what
it receives from the stage before it over the process group; the fake group delivers nothing,
so the schedule cannot run. What ``measure`` runs instead is the schedule's work on this rank:
the stage's own module (``PipelinedModule.stage_module``, the one the schedule would call, built
by the same codegen, sharded on the stage's sub-mesh) on microbatch-sized inputs, in the
schedule's order. 1F1B: stage ``k`` of ``S`` runs ``min(M, S - k)`` forwards before its first
backward and then one backward per forward, so at most that many microbatches' activations are
alive at once; GPipe: all ``M`` forwards, then all backwards. What a stage receives is made here:
a fresh buffer per microbatch (as a receive writes one) of the shape and dtype the traced graph
gives at microbatch size, cut to this rank's shard where the stage has several devices (each
rank of a stage receives its shard, in the layout the sending stage leaves it: codegen's
``Boundary``; floats a constant, integers zeros, valid indices); the gradient each non-last
stage receives for its outputs likewise, shaped as the outputs it sends. Then the optimizer steps this rank's
parameters. The sends move nothing, as every collective on the fake group; the buffers the
receives write are made (``receive``, ``receive_grads``: their memory counts) and their time is
communication's, timed apart from the compute (``measure_comm``).

Predicted, for the same rank: the stage's peak memory per device (``Stage.memory``: its state and
its in-flight microbatches' activations, with the transient of a recomputed block or ZeRO-3's
gathered blocks) and its compute per step (``Stage.compute``: the
microbatches' forward and backward and the optimizer update; plans that do not record it print
the compute as not predicted).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from autopar.core.meta import MetaProp, to_meta


@dataclass
class StageRun:
    """This rank's stage and what it is fed: ``step()`` runs one training step of it."""

    module: torch.nn.Module  # the stage module the schedule calls
    optimizer: torch.optim.Optimizer
    stage: int
    stages: int
    microbatches: int
    in_flight: int
    args: list  # per positional input: a meta tensor (received: made per microbatch) or a value
    kwargs: dict
    device: torch.device

    @property
    def is_last(self) -> bool:
        return self.stage == self.stages - 1

    def _received(self) -> tuple[tuple, dict]:
        return receive(self.args, self.device), receive(self.kwargs, self.device)

    def _backward(self, out) -> None:
        if self.is_last:
            out.backward()
            return
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,))
                if isinstance(o, torch.Tensor) and o.requires_grad]
        torch.autograd.backward(outs, receive_grads(outs))

    def step(self) -> None:
        pending = []
        for _ in range(self.microbatches):
            args, kwargs = self._received()
            pending.append(self.module(*args, **kwargs))
            if len(pending) >= self.in_flight:
                self._backward(pending.pop(0))
        while pending:
            self._backward(pending.pop(0))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def receive(values, device):
    """What a stage's receives write for one microbatch: a fresh buffer for each meta tensor of
    ``values`` (a tuple or dict), as a receive writes one (a constant: as cheap to make as the
    receive's copy, and as dense for the kernels as any activation); the model's own inputs, which
    every rank of a pipeline is given, as they are. Communication: ``measure_comm`` times it apart."""
    def fresh(v):
        if not isinstance(v, torch.Tensor) or not v.is_meta:
            return v
        if v.is_floating_point():
            return torch.full(v.shape, 0.5, dtype=v.dtype, device=device).requires_grad_(True)
        return torch.zeros(v.shape, dtype=v.dtype, device=device)

    if isinstance(values, dict):
        return {k: fresh(v) for k, v in values.items()}
    return tuple(fresh(v) for v in values)


def receive_grads(outs: list) -> list:
    """The gradients a non-last stage receives for its outputs: a buffer each, a constant (drawing
    random numbers would be work a stage does not do). Communication, as ``receive``."""
    return [torch.full_like(o, 1e-3) for o in outs]


class _Values(MetaProp):
    """The traced graph on meta tensors, keeping every node's value (shapes and dtypes)."""

    def __init__(self, gm) -> None:
        super().__init__(gm)
        self.values: dict[str, object] = {}

    def run_node(self, n):
        value = super().run_node(n)
        self.values[n.name] = value
        return value

    def placeholder(self, target, args, kwargs):
        return to_meta(super().placeholder(target, args, kwargs))


def microbatch(inputs: tuple, microbatches: int) -> tuple:
    """The first microbatch of the model's inputs (tensors cut along dim 0, as the schedule cuts)."""
    return tuple(x.tensor_split(microbatches)[0] if isinstance(x, torch.Tensor) and x.dim() else x for x in inputs)


def _received_shard(stage, name: str, value: torch.Tensor) -> torch.Tensor:
    """The meta tensor a stage receives for ``name``: its shard in the layout the sending stage
    leaves it in (``codegen`` ``Boundary``), or the whole tensor (a stage of one device)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    program = getattr(stage, "program", None)
    placements = program.boundary.inputs.get(name) if program is not None else None
    if placements is None:
        return value
    shape, _ = compute_local_shape_and_global_offset(value.shape, stage.mesh, placements)
    spec = program.input_specs.get(name)  # under mixed precision what an earlier stage sends is bf16
    dtype = getattr(torch, spec.dtype) if spec is not None and value.is_floating_point() else value.dtype
    return torch.empty(shape, dtype=dtype, device="meta")


def stage_run(model, module, plan, graph, inputs: tuple, device, lr: float) -> StageRun:
    """What this rank runs of a pipelined plan of ``model``: ``module`` is its ``PipelinedModule``."""
    from autopar.codegen.exported import fx_form
    from autopar.codegen.stage_split import check_stages, split_stages
    from autopar.search.pipeline import in_flight

    gm = fx_form(graph, model).fx_graph  # an exported graph's state read by name, as codegen cut it
    stages = check_stages(plan.stages, [n.name for n in graph.nodes], plan.devices)
    part = split_stages(gm, stages, inputs)[module.stage_index]
    micro = microbatch(tuple(inputs), module.microbatches)
    probe = _Values(gm)
    probe.run(*micro)
    names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    stage = module.stage_module
    if module.is_first:
        args, kwargs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in micro], {}
    else:  # meta: made per microbatch, this rank's shard where the stage has several devices
        args = [_received_shard(stage, v, probe.values[v]) for v in part.carried_in]
        kwargs = {k: x.to(device) if isinstance(x, torch.Tensor) else x for k, x in zip(names, micro)}
    optimizer = (stage.optimizer(torch.optim.AdamW, lr=lr) if hasattr(stage, "optimizer")
                 else torch.optim.AdamW(list(module.parameters()), lr=lr, foreach=True))
    held = in_flight(plan.schedule or "gpipe", module.stage_index, module.num_stages, module.microbatches)
    return StageRun(stage, optimizer, module.stage_index, module.num_stages, module.microbatches, held, args, kwargs,
                    torch.device(device))
