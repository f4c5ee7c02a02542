"""Bytes each device holds for one node under one config, and for a whole plan.

Training (the default) holds, per device:

* parameters: each parameter's local shard (a parameter is sharded along the mesh axes that cut a
  dim indexing it, replicated along the others);
* gradients: one per floating-point parameter, sharded like it;
* optimizer state: Adam keeps two fp32 moments per parameter element (``exp_avg``,
  ``exp_avg_sq``), SGD with momentum one fp32 buffer, plain SGD / ``None`` nothing;
* activations saved for backward: the tensors the op's backward reads, sharded per the config's
  layouts. Shape-only and additive ops save nothing, ops whose gradient is a function of their
  output (softmax, sigmoid, tanh, exp) save the output, every other op saves its data inputs
  (a linear needs ``x`` for ``dW``, a norm its input, a matmul both operands).

Inference holds the parameters only (activations live one layer at a time). A parameter read by
several nodes is counted at the first of them (``skip``), so a plan's total is a plain sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.core.ir import Node
from autopar.core.layout import (NodeLayouts, node_layouts, owner_matrix, shard_factor, shard_factors,
                            to_mesh)
from autopar.core.tables import Config, Mesh

FLOAT_DTYPES = {"float64", "float32", "float16", "bfloat16", "complex64"}
OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "sgd": 1, "momentum": 1, "sgd_momentum": 1,
                    "plain_sgd": 0, "none": 0}
OPTIMIZER_STATE_BYTES = 4  # fp32 moments, whatever the parameter dtype

SAVES_NOTHING = {
    "add", "sub", "neg", "view", "reshape", "flatten", "unflatten", "transpose", "permute",
    "contiguous", "split", "chunk", "getitem", "slice", "cat", "stack", "expand", "squeeze",
    "unsqueeze", "identity", "output", "placeholder", "clone", "to", "type_as",
}
LINEAR_FNS = {"add", "sub", "neg", "iadd", "isub"}  # ``elementwise`` nodes whose backward needs no input
SAVES_OUTPUT = {"softmax", "log_softmax", "sigmoid", "tanh", "exp"}


def _saves(node: Node) -> bool:
    if node.op in SAVES_NOTHING:
        return False
    return not (node.op == "elementwise" and node.attrs.get("fn") in LINEAR_FNS)


def optimizer_states(optimizer: str | None) -> int:
    key = (optimizer or "none").lower()
    if key not in OPTIMIZER_STATES:
        raise ValueError(f"unknown optimizer {optimizer!r}; known: {', '.join(OPTIMIZER_STATES)}")
    return OPTIMIZER_STATES[key]


@dataclass(frozen=True)
class MemoryBreakdown:
    params: float = 0.0
    grads: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations


def node_memory(node: Node, config: Config, mesh: Mesh, mode: str = "train",
                optimizer: str | None = "adam", skip: frozenset[str] = frozenset(),
                layouts: NodeLayouts | None = None) -> MemoryBreakdown:
    """Bytes per device; parameters whose ``source`` is in ``skip`` are counted elsewhere."""
    cfg = to_mesh(config, mesh)
    if cfg is None:
        return MemoryBreakdown(params=float("inf"))
    lay = layouts or node_layouts(node, cfg, mesh)
    train = mode in ("train", "training")
    states = optimizer_states(optimizer) if train else 0
    params = grads = opt = acts = 0.0
    for op, pl in zip(node.params, lay.params):
        if op.source in skip:
            continue
        k = shard_factor(pl, mesh)
        params += op.spec.nbytes / k
        if train and op.spec.dtype in FLOAT_DTYPES:
            grads += op.spec.nbytes / k
            opt += states * OPTIMIZER_STATE_BYTES * op.spec.numel / k
    if train and _saves(node):
        if node.op in SAVES_OUTPUT:
            saved = zip(node.outputs, lay.outputs)
        else:
            saved = ((op.spec, l) for op, l in zip(node.inputs, lay.inputs))
        acts = sum(spec.nbytes / shard_factor(l, mesh) for spec, l in saved)
    return MemoryBreakdown(params, grads, opt, acts)


def node_memory_vector(node: Node, configs: list[Config], mesh: Mesh, mode: str = "train",
                       optimizer: str | None = "adam",
                       skip: frozenset[str] = frozenset()) -> np.ndarray:
    """``node_memory(...).total`` for every config at once (numpy over configs)."""
    own, ok = owner_matrix(configs, mesh)
    train = mode in ("train", "training")
    states = optimizer_states(optimizer) if train else 0
    total = np.zeros(len(configs))
    for op in node.params:
        if op.source in skip:
            continue
        k = shard_factors(node, op.spec, own, mesh)
        per_byte = 1.0
        if train and op.spec.dtype in FLOAT_DTYPES:
            per_byte += 1.0 + states * OPTIMIZER_STATE_BYTES / op.spec.itemsize
        total += per_byte * op.spec.nbytes / k
    if train and _saves(node):
        if node.op in SAVES_OUTPUT:
            saved = [(s, True) for s in node.outputs]
        else:
            saved = [(op.spec, False) for op in node.inputs]
        for spec, out in saved:
            total += spec.nbytes / shard_factors(node, spec, own, mesh, out)
    return np.where(ok, total, np.inf)


def plan_memory(graph, choice: dict[str, Config], mesh: Mesh, mode: str = "train",
                optimizer: str | None = "adam") -> tuple[float, dict[str, MemoryBreakdown]]:
    """(total bytes per device, per-node breakdown) of a plan; shared parameters counted once."""
    seen: set[str] = set()
    per: dict[str, MemoryBreakdown] = {}
    for n in graph.nodes:
        per[n.name] = node_memory(n, choice[n.name], mesh, mode, optimizer, frozenset(seen))
        seen.update(p.source for p in n.params)
    return sum(b.total for b in per.values()), per
