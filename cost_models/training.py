"""What ZeRO, mixed precision and recomputation cost and save, as plain arithmetic.

Both the per-node models (``analytic.py``, ``memory.py``) and the hierarchical search price with
these functions, so a plan of either kind means the same thing.

Bytes a parameter of ``numel`` elements holds in training, before any sharding (ZeRO paper,
Rajbhandari et al. 2020, section 3.1: "16 bytes per parameter" for mixed-precision Adam):

=============== ============================== ==========================================
state           fp32 training                  mixed precision (bf16/fp16)
=============== ============================== ==========================================
parameters      4 numel                        2 numel (the compute copy)
gradients       4 numel                        2 numel
optimizer       4 k numel (k moments: Adam 2)  4 k numel + 4 numel (fp32 master weights)
=============== ============================== ==========================================

ZeRO over a data-parallel group of ``g`` devices divides the optimizer state (and master weights)
by g at stage >= 1, the gradients at stage >= 2, the parameters at stage 3.

Communication per step over that group (ring collectives, ``alpha_beta``), with ``G`` the local
gradient bytes, ``P`` the local parameter bytes and ``m`` microbatches accumulated per step:

* stage 0: one all-reduce of G (gradients accumulate locally over the microbatches);
* stage 1: one reduce-scatter of G, then one all-gather of the updated P;
* stage 2: a reduce-scatter of G per microbatch (the full gradient is never held), one
  all-gather of P;
* stage 3: per microbatch an all-gather of P before the forward, another before the backward
  (the gathered copy is freed in between) and a reduce-scatter of G.

With m = 1 and P = G, stages 0, 1 and 2 move the same bytes (all-reduce = reduce-scatter +
all-gather) and stage 3 moves 1.5x.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.cost_models.alpha_beta import collective_time

OPTIMIZER_STATE_BYTES = 4  # fp32 moments, whatever the parameter dtype
MASTER_BYTES = 4  # fp32 master weights of mixed precision


@dataclass(frozen=True)
class ParamBytes:
    params: float
    grads: float
    optimizer: float  # optimizer state + master weights

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def param_bytes(numel: float, itemsize: int, states: int, master: bool, zero: int = 0,
                group: float = 1.0) -> ParamBytes:
    """Bytes one device holds for ``numel`` parameter elements (already divided by any tensor
    sharding), under ZeRO stage ``zero`` over ``group`` data-parallel devices."""
    opt = numel * (states * OPTIMIZER_STATE_BYTES + (MASTER_BYTES if master else 0))
    return ParamBytes(params=numel * itemsize / (group if zero >= 3 else 1),
                      grads=numel * itemsize / (group if zero >= 2 else 1),
                      optimizer=opt / (group if zero >= 1 else 1))


def zero_collectives(zero: int, grad_bytes: float, param_bytes_: float, microbatches: int = 1
                     ) -> list[tuple[str, int, float]]:
    """(kind, how many per step, N bytes per device) of the data-parallel sync of one bucket."""
    m = max(1, int(microbatches))
    if zero == 0:
        return [("all-reduce", 1, grad_bytes)]
    if zero == 1:
        return [("reduce-scatter", 1, grad_bytes), ("all-gather", 1, param_bytes_)]
    if zero == 2:
        return [("reduce-scatter", m, grad_bytes), ("all-gather", 1, param_bytes_)]
    return [("all-gather", 2 * m, param_bytes_), ("reduce-scatter", m, grad_bytes)]


def zero_sync_time(zero: int, grad_bytes, param_bytes_, p, bandwidth, latency, microbatches: int = 1,
                   cluster=None, call_share=1.0):
    """Seconds of ``zero_collectives`` over a group of ``p`` devices (numpy-friendly); with
    ``cluster``, each kind on its links as that cluster's ``kind_link`` gives them, plus its
    ``call_latency`` times ``call_share`` (a bucket's share of it, as ``latency`` already is),
    and each gradient reduction's bucket copy (``bucket_copy_time``)."""
    total = 0.0
    for kind, count, nbytes in zero_collectives(zero, grad_bytes, param_bytes_, microbatches):
        bw, lat = cluster.kind_link(kind, bandwidth, latency) if cluster is not None else (bandwidth, latency)
        fixed = cluster.call_latency * call_share if cluster is not None else 0.0
        total = total + count * (collective_time(kind, nbytes, p, bw, lat, fixed)
                                 + bucket_copy_time(kind, nbytes, p, cluster))
    return total


def bucket_copy_time(kind: str, grad_bytes, p, cluster):
    """Seconds of copying the gradients into their bucket's flat buffer before a gradient
    reduction (``kind`` an all-reduce or reduce-scatter over ``p`` > 1 devices; 0 otherwise): the
    runtime's buckets (``codegen/runtime.py``, as DDP's without ``gradient_as_bucket_view``)
    copy each gradient autograd made into the buffer the collective reduces, a plain copy of the
    gradient's bytes at ``Cluster.copy_time`` (fitted on a live group; 0 on the presets). The zoo
    mlp's data-parallel step spent 1.1 ms a step in those copies on 2 gloo ranks, unpriced before.
    numpy-friendly in ``grad_bytes`` and ``p``."""
    rate = cluster.copy_time if cluster is not None else 0.0
    if not rate or kind not in ("all-reduce", "reduce-scatter"):
        return 0.0
    if isinstance(p, np.ndarray) or isinstance(grad_bytes, np.ndarray):
        return np.where(np.asarray(p) > 1, rate * np.asarray(grad_bytes, dtype=float), 0.0)
    return rate * float(grad_bytes) if p > 1 else 0.0


def zero_label(zero: int) -> str:
    return {0: "weight-grad sync (bucketed)",
            1: "ZeRO-1 sync: reduce-scatter grads, all-gather params",
            2: "ZeRO-2 sync: reduce-scatter grads, all-gather params",
            3: "ZeRO-3: all-gather params (forward, backward), reduce-scatter grads"}[zero]


# Passes over one fp32 element that torch's element-wise updates make when each op of the update is
# its own pass over whole tensors (its foreach and per-tensor implementations, which the generated
# module's ``optimizer()`` runs; ``optimizer_step.OPTIMIZER_PASSES`` counts them op by op, and
# ``tests/cost_models/test_update_passes.py`` counts the bytes each op of torch's updates reads and
# writes): two moments, AdamW's 21 (Adam's 19: priced as AdamW's, at most 11% high); one, SGD
# with momentum's mul_ and add_ of the buffer (2 + 3) and add_ into the parameter (3) = 8; none,
# plain SGD's add_ (3).
UPDATE_PASSES = {2: 21, 1: 8, 0: 3}


# fp32 buffers per stepped element that torch's element-wise update allocates and holds while it
# runs, the gradients still alive and the activations freed: Adam's and AdamW's foreach update
# takes the second moments' square root out of place (``_foreach_sqrt``, over every parameter of
# the group at once), then divides and adds into that buffer in place; SGD's updates run in place.
UPDATE_TEMPORARIES = {2: 1, 1: 0, 0: 0}


def update_working_set(numel: float, states: int, foreach: bool) -> float:
    """Bytes the optimizer's update allocates beyond the state it keeps, for ``numel`` stepped
    elements on one device (under ZeRO: its slice): torch's own update (``foreach``, what the
    generated module's ``optimizer()`` runs) holds ``UPDATE_TEMPORARIES`` fp32 buffers of them;
    a fused kernel none. The step's peak is then the larger of the backward's (activations in
    flight) and the update's (this, on top of the parameters, gradients and optimizer state)."""
    if not foreach:
        return 0.0
    return numel * UPDATE_TEMPORARIES.get(states, UPDATE_TEMPORARIES[2]) * OPTIMIZER_STATE_BYTES


def optimizer_step_time(numel: float, itemsize: int, states: int, master: bool,
                        memory_bandwidth: float, efficiency: float = 0.8, foreach: bool = False) -> float:
    """An element-wise optimizer step is memory-bound. Fused into one kernel (Megatron's and
    apex's fused Adam, which the published trainings ran) it reads the gradient, reads and writes
    every moment and the weights (fp32 master and the compute copy when mixed). ``foreach``
    (``Cluster.foreach_update``): torch's own update, op by op, every op reading and writing whole
    fp32 tensors (``UPDATE_PASSES``, on the master weights when mixed, which also read the
    gradient and write the compute copy): on a CPU thread AdamW took 3.3-4.8 ns an element over
    0.5-8 M elements, what its 84 B an element take at the preset's 21.6 GB/s (3.9), where the
    fused count, 28 B, priced a pipeline stage's update at a third of what it took."""
    if foreach:
        passes = UPDATE_PASSES.get(states, UPDATE_PASSES[2])
        moved = numel * (passes * OPTIMIZER_STATE_BYTES + (2 * itemsize if master else 0))
        return moved / (memory_bandwidth * efficiency)
    moved = numel * (itemsize + 2 * states * OPTIMIZER_STATE_BYTES
                     + 2 * (MASTER_BYTES if master else 0) + 2 * itemsize)
    return moved / (memory_bandwidth * efficiency)


# Passes over a gradient element that adding one microbatch's gradient into the held one makes:
# autograd's AccumulateGrad runs ``grad += new`` in place once ``.grad`` exists (reads both,
# writes one); the first microbatch's gradient is stored as ``.grad`` without a pass.
ACCUMULATE_PASSES = 3


def accumulation_time(grad_bytes, microbatches: int, memory_bandwidth: float, efficiency: float = 0.8):
    """Seconds per microbatch a rank spends adding each microbatch's weight gradients into those
    it holds (numpy-friendly in ``grad_bytes``, the gradient bytes the rank accumulates: whole
    with ZeRO 0/1, its shard with ZeRO 2/3, reduce-scattered per microbatch).

    With ``m`` microbatches a step, ``m - 1`` of them add into ``.grad``: ``ACCUMULATE_PASSES``
    passes over the gradient bytes, element-wise and memory-bound, on the stream of the backward
    that made the gradient, so on the critical path of that microbatch: ``(m - 1) / m x 3 G / (B
    x efficiency)`` per microbatch on average. It grows with the parameters a rank holds and not
    with its tokens, so it weighs most where a pipeline rank holds billions of parameters and
    runs microbatches of one sequence (Narayanan et al. 2021, Table 1: a 1T-parameter stage of 2
    layers holds 2.0e9 parameters per GPU and runs 2048 tokens a microbatch, 16k FLOPs of
    compute per parameter against 6 bytes of accumulation: about 6% of its time on an A100).
    Codes that accumulate in fp32 (Megatron-LM's ``main_grad``, DeepSpeed's bf16 optimizer) move
    10 bytes per half-precision element, not 6: priced as torch's own accumulation, what the
    generated program runs."""
    if microbatches <= 1:
        return 0.0 * grad_bytes
    return (microbatches - 1) / microbatches * ACCUMULATE_PASSES * grad_bytes / (memory_bandwidth * efficiency)


def zero3_gathered(units: list[float], roots: list[bool]) -> float:
    """Bytes a ZeRO-3 rank holds whole on top of its shards, from each unit's whole parameter and
    gradient bytes (over its ZeRO group, after any tensor split): every root unit's (not a block:
    embeddings, final norm, head), whole for the whole step as ``fully_shard`` leaves the root
    module, and the two largest blocks' (in the backward: the block running, its gradients being
    made, and the one gathered beside it, or whose gradients' reduce-scatter is under way; the
    forward holds less). What ``codegen/zero_units.py`` holds; both planning paths price it so."""
    blocks = sorted((b for b, r in zip(units, roots) if not r), reverse=True)
    return float(sum(b for b, r in zip(units, roots) if r) + sum(blocks[:2]))
