"""Bytes each device holds for one node under one config, and for a whole plan.

Training (the default) holds, per device:

* parameters: each parameter's local shard (a parameter is sharded along the mesh axes that cut a
  dim indexing it, replicated along the others);
* gradients: one per floating-point parameter, sharded like it;
* optimizer state: Adam keeps two fp32 moments per parameter element (``exp_avg``,
  ``exp_avg_sq``), SGD with momentum one fp32 buffer, plain SGD / ``None`` nothing;
* activations saved for backward: the tensors the op's backward reads, sharded per the config's
  layouts. Shape-only and additive ops, a product with a Python number, a mean or sum and a
  dropout with p = 0 save nothing (their derivative formulas read no tensor), ops whose gradient
  is a function of their output (softmax, sigmoid, tanh, exp, relu) save the output, every other
  op its data inputs (a linear needs ``x`` for ``dW``, a norm its input, a matmul both operands, a
  dropout its mask: on a CPU in the input's dtype; CUDA's is bool, a quarter of that for fp32).
  An input is kept only for a gradient that is taken (``already_saved``): a product keeps each
  factor for the other's gradient, a division its dividend for the divisor's, a ``masked_fill``
  and a ``where`` their condition only, a linear its input for its weight's. A fused attention
  kernel (``sdpa``: flash, memory-efficient, cuDNN and the CPU's flash kernel alike) keeps its
  query, key and value, its output and the softmax's log-sum-exp per query row in fp32, for a
  backward that runs the attention again blockwise; a max pool its input and the int64 position of
  each window's maximum. Buffers and parameters that take no gradient
  (``core.ir.FROZEN_PARAMS``: a rotary table) hold no gradient or optimizer state, and what
  reads only them records no backward; a view of one is its storage, kept at no cost.

Training options (``node.attrs["train"]``, ``autopar.core.strategy.NodeTraining``): mixed
precision adds fp32 master weights (4 bytes per element) to the optimizer state; ZeRO stage z
divides the optimizer state (z >= 1), the gradients (z >= 2) and the parameters (z = 3) by the size
of the parameter's data-parallel group (the mesh axes along which its gradient is a partial sum);
a recomputed node saves only the block inputs it is the first to read (``saved_inputs``).
The arithmetic is ``cost_models/training.py``'s.

A loss also holds, while its backward runs, the gradients that backward makes (``transient``):
the backward starts at the loss with every saved activation still alive, so the step's peak is
there unless a later working set is bigger. ``cross_entropy`` is log-softmax then the negative
log-likelihood (ATen's decomposition): the NLL's backward writes the gradient of the
log-probabilities, and log-softmax's backward, reading it, writes the gradient of the logits,
both the logits' size and layout (``LOSS_GRADIENTS``). The term is per node and added like the
others, so the searches' memory constraint and the plan's total carry it.

A tensor several nodes save is counted at the first of them (``already_saved``).

Inference holds the parameters only (activations live one layer at a time). A parameter read by
several nodes is counted at the first of them (``skip``), so a plan's total is a plain sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.core.backward import FRESH_FNS, needs_grad
from autopar.core.ir import FLOAT_DTYPES, Node, TensorSpec, trainable
from autopar.core.layout import (NodeLayouts, Partial, grad_of_input, node_layouts, owner_matrix, shard_factor,
                                 shard_factors, shard_mask, tensor_layout, to_mesh)
from autopar.core.strategy import node_training
from autopar.core.tables import Config, Mesh
from autopar.cost_models.training import OPTIMIZER_STATE_BYTES, param_bytes, update_working_set  # noqa: F401 (re-exported)

OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "sgd": 1, "momentum": 1, "sgd_momentum": 1,
                    "plain_sgd": 0, "none": 0}

SAVES_NOTHING = {
    "add", "sub", "neg", "view", "reshape", "flatten", "unflatten", "transpose", "permute",
    "contiguous", "split", "chunk", "getitem", "slice", "cat", "stack", "expand", "squeeze",
    "unsqueeze", "identity", "output", "placeholder", "clone", "to", "type_as",
}
LINEAR_FNS = {"add", "sub", "neg", "iadd", "isub"}  # ``elementwise`` nodes whose backward needs no input
SAVES_OUTPUT = {"softmax", "log_softmax", "sigmoid", "tanh", "exp"}
OUTPUT_FNS = {"sigmoid", "tanh", "exp", "rsqrt", "sqrt", "relu", "reciprocal"}  # ``elementwise`` fns whose backward reads their result


def _saves_output(node: Node) -> bool:
    return node.op in SAVES_OUTPUT or (node.op == "elementwise" and node.attrs.get("fn") in OUTPUT_FNS)
# Gradient buffers, each the size and layout of the loss's float input, alive together at the
# peak of the loss's backward (see the module's docstring).
LOSS_GRADIENTS = {"cross_entropy": 2}


SHAPE_FNS = {"expand", "expand_as", "repeat", "broadcast_to"}  # ``elementwise`` shape ops
SCALED_FNS = {"mul", "div", "truediv"}  # by a Python number: the backward scales by it, saves nothing
SUMS = {"mean", "sum"}  # ``reduce``: the gradient is the output's, spread (the input's shape only)


def _saves(node: Node) -> bool:
    """Whether the node's backward reads any tensor (autograd's derivative formulas)."""
    if node.op in SAVES_NOTHING:
        return False
    fn = node.attrs.get("fn")
    if node.op == "elementwise" and (fn in LINEAR_FNS or fn in SHAPE_FNS or fn in FRESH_FNS):
        return False
    if node.op == "elementwise" and fn in SCALED_FNS and len(node.inputs) == 1 and not node.params:
        return False
    if node.op == "reduce" and fn in SUMS:
        return False
    return not (node.op == "dropout" and not (node.attrs.get("training", True) and node.attrs.get("p", 0.5)))



def already_saved(graph) -> dict[str, frozenset[int]]:
    """Per node, the positions of the tensors it does not keep for itself (its inputs, then its
    outputs at ``len(node.inputs) + j``): those an earlier node of ``graph`` saves too (autograd
    keeps the one tensor once, however many backward formulas read it: a norm's input read by its
    square and its product, the softmax's output read by the next matmul), views of a buffer or
    parameter (its storage, held anyway), everything of a node nothing of which needs a gradient
    (a mask, a position table: autograd records no backward for it), and an input kept only for a
    gradient that is not taken (``_kept``: ``q * cos`` keeps cos, not q). An op that returns its
    input's storage (a dropout with p = 0, a view of the whole tensor) passes the tensor on as the
    same tensor. Whether a node saves an input depends on its op only, not on its config, so this
    is one pass over the graph; a reader that gets the tensor resharded saves the new copy, which
    this does not count (readers of one tensor mostly share its layout). Recomputed nodes are left
    as they are."""
    seen: set[tuple[str, int]] = set()
    out: dict[str, frozenset[int]] = {}
    grad = needs_grad(graph)
    alias: dict[tuple[str, int], tuple[str, int]] = {}  # an op that returns its input: the input
    for n in graph.nodes:
        if _returns_input(n):
            k = (n.inputs[0].source, n.inputs[0].output)
            alias[(n.name, 0)] = alias.get(k, k)
        elif _views_state(n):
            alias[(n.name, 0)] = (n.params[0].source, 0)
        if node_training(n).recompute or not _saves(n):
            continue
        keys = [alias.get((o.source, o.output), (o.source, o.output)) for o in n.inputs]
        needs = [k[0] in grad for k in keys]
        if not (any(needs) or any(trainable(n))):  # nothing here needs a gradient: no backward recorded
            out[n.name] = frozenset(range(len(n.inputs) + len(n.outputs)))
            continue
        if _saves_output(n):
            seen.update((n.name, i) for i in range(len(n.outputs)))
            continue
        dup = {i for i, k in enumerate(keys) if k in seen or k[0].startswith("param:")}
        dup |= set(range(len(keys))) - _kept(n, needs)
        if dup:
            out[n.name] = frozenset(dup)
        seen.update(k for i, k in enumerate(keys) if i not in dup)
        if n.op in FUSED_ATTENTION:
            seen.add((n.name, 0))
    return out


FUSED_ATTENTION = {"sdpa"}  # keeps its output and log-sum-exp beside its inputs (module docstring)
PRODUCTS = {"mul", "matmul"}  # d(a*b)/da reads b, d(a*b)/db reads a


def _kept(n: Node, needs: list[bool]) -> set[int]:
    """Positions of the inputs ``n``'s backward keeps, given which inputs need a gradient
    (autograd's derivative formulas): a product's factor only for the other's gradient, a
    division's dividend only for the divisor's (its divisor for either), a ``masked_fill``'s or
    ``where``'s condition only, a linear's input only for its weight's."""
    fn = n.attrs.get("fn") if n.op == "elementwise" else n.op
    every = set(range(len(n.inputs)))
    if fn in PRODUCTS and len(n.inputs) + len(n.params) == 2:
        factors = needs + trainable(n)  # the inputs, then the parameters
        return {i for i in every if factors[1 - i]}
    if fn in ("div", "truediv") and len(n.inputs) == 2:
        return {i for i in every if needs[1] or (i == 1 and needs[0])}
    if fn in ("masked_fill", "where"):
        return {i for i in every if n.inputs[i].spec.dtype not in FLOAT_DTYPES}
    if n.op == "linear" and n.params:
        return every if trainable(n)[0] else set()
    return every


def _views_state(n: Node) -> bool:
    """A view of a buffer or parameter, whole or a slice (``self.cos[:s]``): its storage."""
    return not n.inputs and len(n.params) == 1 and len(n.outputs) == 1 and n.op in VIEWS | {"slice"} \
        and n.outputs[0].dtype == n.params[0].spec.dtype


VIEWS = {"view", "reshape", "transpose", "permute", "flatten", "unflatten", "squeeze", "unsqueeze"}


def _returns_input(n: Node) -> bool:
    """An op whose output is its input's storage, all of it: a dropout with p = 0 (or not
    training), a conversion to the dtype the tensor has, a view of the whole tensor."""
    if len(n.inputs) != 1 or len(n.outputs) != 1:
        return False
    spec, out = n.inputs[0].spec, n.outputs[0]
    if spec.dtype != out.dtype or spec.numel != out.numel:
        return False
    if n.op == "dropout":
        return not _saves(n)
    return n.op in VIEWS or n.op in ("identity", "to", "type_as") or (n.op == "elementwise" and n.attrs.get("fn") == "to")


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
    transient: float = 0.0  # the loss's backward working set (``LOSS_GRADIENTS``)

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.transient


def node_memory(node: Node, config: Config, mesh: Mesh, mode: str = "train",
                optimizer: str | None = "adam", skip: frozenset[str] = frozenset(),
                layouts: NodeLayouts | None = None, shared: frozenset[int] = frozenset()) -> MemoryBreakdown:
    """Bytes per device; parameters whose ``source`` is in ``skip`` are counted elsewhere, and
    so are the saved inputs at positions ``shared`` (``already_saved``)."""
    cfg = to_mesh(config, mesh)
    if cfg is None:
        return MemoryBreakdown(params=float("inf"))
    lay = layouts or node_layouts(node, cfg, mesh)
    train = mode in ("train", "training")
    states = optimizer_states(optimizer) if train else 0
    rec = node_training(node)
    params = grads = opt = acts = 0.0
    for op, pl, grad in zip(node.params, lay.params, trainable(node)):
        if op.source in skip:
            continue
        k = shard_factor(pl, mesh)
        if not (train and grad):
            params += op.spec.nbytes / k
            continue
        group = _data_group(node, cfg, pl, mesh)
        b = param_bytes(op.spec.numel / k, op.spec.itemsize, states, rec.master, rec.zero, group)
        params, grads, opt = params + b.params, grads + b.grads, opt + b.optimizer
    if train and rec.recompute:
        acts = sum(node.inputs[i].spec.nbytes / shard_factor(lay.inputs[i], mesh) for i in rec.saved_inputs)
        acts += sum(spec.nbytes / shard_factor(_saved_layout(node, cfg, mesh, lay, kind, k), mesh)
                    for kind, k, spec in _kept_outputs(node, rec))
    elif train:
        acts = sum(spec.nbytes / shard_factor(_saved_layout(node, cfg, mesh, lay, kind, k), mesh)
                   for kind, k, spec in _saved(node, shared))
    transient = 0.0
    if train and node.op in LOSS_GRADIENTS:
        transient = LOSS_GRADIENTS[node.op] * sum(op.spec.nbytes / shard_factor(l, mesh)
                                                  for op, l in zip(node.inputs, lay.inputs)
                                                  if op.spec.dtype in FLOAT_DTYPES)
    return MemoryBreakdown(params, grads, opt, acts, transient)


def _saved(node: Node, shared: frozenset[int]) -> list[tuple[str, int, TensorSpec]]:
    """The tensors the node keeps for its backward that no other node counts, as (kind, position,
    spec): ``"input"``/``"output"`` (positions in ``shared`` as ``already_saved`` numbers them:
    inputs, then outputs after them) or ``"lse"``, a fused attention's log-sum-exp: its output's
    rows (the value dim dropped), fp32."""
    if not _saves(node):
        return []
    nin = len(node.inputs)
    if _saves_output(node):
        return [("output", j, spec) for j, spec in enumerate(node.outputs) if nin + j not in shared]
    kept = [("input", i, op.spec) for i, op in enumerate(node.inputs) if i not in shared]
    if node.op in FUSED_ATTENTION and nin not in shared:
        out = node.outputs[0]
        kept += [("output", 0, out), ("lse", 0, TensorSpec(out.shape[:-1], "float32", out.axes[:-1]))]
    if node.op == "pool" and node.attrs.get("kind") == "max" and nin not in shared:  # the argmax per window
        out = node.outputs[0]
        kept.append(("output", 0, TensorSpec(out.shape, "int64", out.axes)))
    if node.op == "moe_experts" and nin not in shared:
        kept += [("internal", k, spec) for k, spec in enumerate(_expert_internals(node))]
    return kept


def _kept_outputs(node: Node, rec) -> list[tuple[str, int, TensorSpec]]:
    """What a recomputed node whose outputs are kept (``NodeTraining.kept``: pointwise
    recomputation's matmuls and fused attentions) holds: every output, and a fused attention's
    log-sum-exp beside it (torch's selective checkpoint caches all of the kernel's outputs)."""
    if not rec.kept:
        return []
    kept = [("output", j, spec) for j, spec in enumerate(node.outputs)]
    if node.op in FUSED_ATTENTION:
        out = node.outputs[0]
        kept.append(("lse", 0, TensorSpec(out.shape[:-1], "float32", out.axes[:-1])))
    return kept


def _expert_internals(node: Node) -> list[TensorSpec]:
    """What a routed experts node keeps inside, per routed token (``tokens x top_k`` rows, split
    as the tokens are), as its code runs each expert on its tokens (the zoo's, Mixtral's): the
    gathered input, the up projections' outputs (gate and up), the activation's output where
    gated, the down projection's input and output, the output scaled by the router's weight
    (``index_add`` keeps its source), the weight; and two int64 indices (token, slot)."""
    x = node.inputs[0].spec
    width, experts = x.shape[-1], node.attrs.get("experts", 1)
    per = max(len(node.params) // experts, 1) if node.attrs.get("listed") else len(node.params)
    mats = [p.spec.shape[-2:] if not node.attrs.get("listed") else p.spec.shape for p in node.params[:per]]
    up = sum(m[0] for m in mats if len(m) == 2 and m[1] == width)
    hidden = next((m[1] for m in mats if len(m) == 2 and m[0] == width and m[1] != width), up)
    rows = x.numel // width * node.attrs.get("top_k", 1)
    elems = 3 * width + up + hidden + (hidden if up > hidden else 0) + 1
    return [TensorSpec((rows, elems), x.dtype, (x.axes[0], ())), TensorSpec((rows, 2), "int64", (x.axes[0], ()))]


def _saved_layout(node: Node, cfg: Config, mesh: Mesh, lay: NodeLayouts, kind: str, k: int):
    if kind == "input":
        return lay.inputs[k]
    if kind == "output":
        return lay.outputs[k]
    if kind == "internal":
        return tensor_layout(node, cfg, _expert_internals(node)[k], mesh)
    out = node.outputs[0]
    return tensor_layout(node, cfg, TensorSpec(out.shape[:-1], "float32", out.axes[:-1]), mesh, output=True)


def _data_group(node: Node, cfg: Config, layout, mesh: Mesh) -> int:
    """Devices over which a parameter's gradient is a partial sum: its ZeRO group."""
    g = grad_of_input(layout, node, cfg, mesh)
    out = 1
    for a, pl in enumerate(g):
        if isinstance(pl, Partial):
            out *= mesh.shape[a]
    return out


def node_memory_vector(node: Node, configs: list[Config], mesh: Mesh, mode: str = "train",
                       optimizer: str | None = "adam",
                       skip: frozenset[str] = frozenset(), shared: frozenset[int] = frozenset()) -> np.ndarray:
    """``node_memory(...).total`` for every config at once (numpy over configs)."""
    own, ok = owner_matrix(configs, mesh)
    train = mode in ("train", "training")
    rec = node_training(node)
    total, _ = _state_vector(node, own, mesh, train, optimizer, skip)
    if train and rec.recompute:
        for i in rec.saved_inputs:
            spec = node.inputs[i].spec
            total += spec.nbytes / shard_factors(node, spec, own, mesh)
        for kind, _, spec in _kept_outputs(node, rec):
            total += spec.nbytes / shard_factors(node, spec, own, mesh, True)
    elif train:
        for kind, _, spec in _saved(node, shared):
            total += spec.nbytes / shard_factors(node, spec, own, mesh, kind in ("output", "lse"))
    if train and node.op in LOSS_GRADIENTS:
        for op in node.inputs:
            if op.spec.dtype in FLOAT_DTYPES:
                total += LOSS_GRADIENTS[node.op] * op.spec.nbytes / shard_factors(node, op.spec, own, mesh)
    return np.where(ok, total, np.inf)


def _state_vector(node: Node, own, mesh: Mesh, train: bool, optimizer: str | None,
                  skip: frozenset[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per config (``own``: ``owner_matrix``'s), the bytes of the node's parameters, gradients and
    optimizer state on a device, and the parameter elements its optimizer steps there (its shard,
    under ZeRO >= 1 its slice of that over the data-parallel group)."""
    states = optimizer_states(optimizer) if train else 0
    rec = node_training(node)
    sizes = np.asarray(mesh.shape, dtype=float)
    total, stepped = np.zeros(len(own)), np.zeros(len(own))
    for op, grad in zip(node.params, trainable(node)):
        if op.source in skip:
            continue
        k = shard_factors(node, op.spec, own, mesh)
        if not (train and grad):
            total += op.spec.nbytes / k
            continue
        if rec.zero:  # the partial (data-parallel) axes: those cutting a dim that does not index it
            group = np.prod(np.where((own >= 0) & ~shard_mask(node, op.spec, own), sizes, 1.0), axis=1)
        else:
            group = 1.0
        b = param_bytes(op.spec.numel / k, op.spec.itemsize, states, rec.master, rec.zero, group)
        total += b.params + b.grads + b.optimizer
        stepped += op.spec.numel / k / (group if rec.zero >= 1 else 1.0)
    return total, stepped


def update_memory_vector(node: Node, configs: list[Config], mesh: Mesh, optimizer: str | None = "adam",
                         foreach: bool = False, skip: frozenset[str] = frozenset()) -> np.ndarray:
    """Per config, the bytes the node holds on a device while the optimizer's update runs (the
    activations freed): its parameters, gradients and optimizer state, and the update's working
    set over the elements it steps (``training.update_working_set``, the hierarchical pricing's
    too). Summed over a plan's nodes it is the update's peak, beside the backward's
    (``node_memory_vector``'s sum); the step's peak is the larger."""
    own, ok = owner_matrix(configs, mesh)
    total, stepped = _state_vector(node, own, mesh, True, optimizer, skip)
    total = total + update_working_set(stepped, optimizer_states(optimizer), foreach)
    return np.where(ok, total, np.inf)


def plan_memory(graph, choice: dict[str, Config], mesh: Mesh, mode: str = "train",
                optimizer: str | None = "adam") -> tuple[float, dict[str, MemoryBreakdown]]:
    """(total bytes per device, per-node breakdown) of a plan; shared parameters counted once."""
    seen: set[str] = set()
    per: dict[str, MemoryBreakdown] = {}
    dup = already_saved(graph)
    for n in graph.nodes:
        per[n.name] = node_memory(n, choice[n.name], mesh, mode, optimizer, frozenset(seen),
                                  shared=dup.get(n.name, frozenset()))
        seen.update(p.source for p in n.params)
    return sum(b.total for b in per.values()), per


def saved_tensors(node: Node, config: Config, mesh: Mesh, mode: str = "train",
                  shared: frozenset[int] = frozenset()) -> list[tuple[float, int]]:
    """(bytes of the whole tensor, the config's shard factor of it) for each activation
    ``node_memory`` counts as saved for the backward: what a layout that keeps its saved tensors
    sharded differently (sequence parallelism: every saved tensor at 1/t of the tensor group,
    gathered again in the backward) counts afresh."""
    cfg = to_mesh(config, mesh)
    if cfg is None or mode not in ("train", "training"):
        return []
    lay = node_layouts(node, cfg, mesh)
    rec = node_training(node)
    if rec.recompute:
        return [(node.inputs[i].spec.nbytes, shard_factor(lay.inputs[i], mesh)) for i in rec.saved_inputs] + [
            (spec.nbytes, shard_factor(_saved_layout(node, cfg, mesh, lay, kind, k), mesh))
            for kind, k, spec in _kept_outputs(node, rec)]
    return [(spec.nbytes, shard_factor(_saved_layout(node, cfg, mesh, lay, kind, k), mesh))
            for kind, k, spec in _saved(node, shared)]


saves_for_backward = _saves  # whether a node's backward reads any tensor (``backward_set.py``)
