"""What a training plan does beyond splitting nodes: ZeRO sharding, mixed precision, recomputation,
and, for plans of the hierarchical search, its degrees of tensor / pipeline / data parallelism.

The cost and memory models price these (``cost_models/training.py``) from the per-node record
``NodeTraining`` that ``autopar.core.blocks.apply_training`` puts in ``node.attrs["train"]`` (so a
node's cost is still a function of its signature, and tables of nodes with equal records are
shared). The planner keeps the chosen options in ``Plan.strategy`` (saved in the plan file), which
is what codegen reads:

* ``zero``: 0 plain data parallelism; 1 optimizer state and fp32 master weights sharded over the
  data-parallel mesh axes ``zero_axes`` (reduce-scatter of the gradients, all-gather of the
  updated parameters); 2 also the gradients; 3 also the parameters, gathered before each use
  (``fully_shard`` / FSDP2 over those axes).
* ``precision``: "fp32", or "bf16" / "fp16" mixed precision: compute (autocast) in that dtype,
  parameters and gradients held in it, fp32 master weights and optimizer state.
* ``recompute``: module paths (repeated blocks) whose forward is re-run in the backward
  (``torch.utils.checkpoint`` around each); only their inputs are saved.
* ``accumulate``: gradient accumulation, the batch run as that many equal microbatches one after
  another, gradients summed locally and synchronized (and the optimizer stepped) once per step:
  a microbatch's activations for k forwards and backwards.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

PRECISIONS = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
ZERO_STAGES = (0, 1, 2, 3)
# The recompute mode that re-runs only each attention's core (scores, softmax, dropout and the
# product with the values), not the linears: Korthikanti et al. 2022's selective recomputation,
# beside False (none) and True (every repeated block's forward).
RECOMPUTE_ATTENTION = "attention"
# The recompute mode that re-runs every repeated block's pointwise ops (norms, activations, rotary
# products, residual adds, casts) and keeps its matmuls' and fused attentions' outputs: op-level
# selective activation checkpointing (torch.utils.checkpoint's selective contexts; torchtitan's
# "selective op" AC). ``core/selective.py`` names the kept ops.
RECOMPUTE_POINTWISE = "pointwise"
RECOMPUTE_MODES = (False, True, RECOMPUTE_ATTENTION, RECOMPUTE_POINTWISE)
RECOMPUTE_NAMES = {RECOMPUTE_ATTENTION: "attention-only recompute",
                   RECOMPUTE_POINTWISE: "pointwise recompute (matmul and attention outputs kept)"}
# Each ZeRO stage under the name users also know it by. ZeRO-3 is FSDP (FSDP2's ``fully_shard``
# per block, FSDP1's FULL_SHARD); ZeRO-2 is FSDP2 with ``reshard_after_forward=False`` (FSDP1's
# SHARD_GRAD_OP). codegen/zero.py shards the gradient buckets itself (why: its docstring); the
# collectives and memory are those of the named wrapping.
ZERO_NAMES = {0: "no ZeRO", 1: "ZeRO-1", 2: "ZeRO-2 (FSDP2 fully_shard, reshard_after_forward=False)",
              3: "ZeRO-3 (FSDP2 fully_shard)"}


def default_precision(cluster) -> str:
    """The precision a training plan takes when none is asked, on every planning path: the
    devices' fastest mixed precision where it is faster than fp32 (bf16 on a tie: no loss
    scaling), else fp32 (the ``cpu`` preset, GPUs whose half precision is no faster).
    ``cluster``: anything with ``peak(dtype)`` (``core.cluster.Cluster``)."""
    best = max(PRECISIONS, key=lambda k: (cluster.peak(PRECISIONS[k]), k == "bf16", k == "fp32"))
    return best if cluster.peak(PRECISIONS[best]) > cluster.peak("float32") else "fp32"


@dataclass(frozen=True)
class TrainingOptions:
    """One global choice of ZeRO stage, precision and per-block recomputation."""

    zero: int = 0
    precision: str = "fp32"
    recompute: bool | str = False  # or RECOMPUTE_ATTENTION, RECOMPUTE_POINTWISE
    every: int = 1  # with ``recompute``: every k-th repeated block (blocks 0, k, 2k, ...) is recomputed
    accumulate: int = 1  # gradient accumulation: microbatches per step, one gradient sync

    def __post_init__(self) -> None:
        if not (isinstance(self.accumulate, int) and self.accumulate >= 1):
            raise ValueError(f"gradient accumulation needs an integer count of microbatches >= 1, "
                             f"not {self.accumulate!r}")
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute must be True, False, {RECOMPUTE_ATTENTION!r} or {RECOMPUTE_POINTWISE!r}, "
                             f"not {self.recompute!r}")
        if self.zero not in ZERO_STAGES:
            raise ValueError(f"zero must be one of {ZERO_STAGES} (ZeRO stage), not {self.zero!r}")
        if not (isinstance(self.every, int) and self.every >= 1):
            raise ValueError(f"recompute every k-th block needs an integer k >= 1, not {self.every!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {self.precision!r}")

    @property
    def compute_dtype(self) -> str:
        return PRECISIONS[self.precision]

    @property
    def mixed(self) -> bool:
        """Mixed precision: low-precision compute, fp32 master weights beside the parameters."""
        return self.precision != "fp32"

    def describe(self) -> str:
        parts = [ZERO_NAMES[self.zero],
                 f"{self.precision} mixed precision" if self.mixed else "fp32",
                 RECOMPUTE_NAMES[self.recompute] if self.recompute in RECOMPUTE_NAMES else
                 ("recompute per block" if self.every == 1 else f"recompute every {self.every} blocks")
                 if self.recompute else "no recomputation"]
        if self.accumulate > 1:
            parts.append(f"gradient accumulation over {self.accumulate} microbatches")
        return ", ".join(parts)


@dataclass(frozen=True)
class NodeTraining:
    """How training treats one node (``node.attrs["train"]``); the default is plain training.

    ``recompute``: the node sits in a recomputed block: its forward runs again in the backward
    and it saves nothing for the backward except its inputs at ``saved_inputs`` (the block's
    inputs, each kept once, by the first node that reads it). ``kept``: with ``recompute``, the
    node's outputs are kept instead of re-run (pointwise recomputation's matmuls and fused
    attentions: selective checkpointing's MUST_SAVE ops); its forward does not run again.
    ``zero``: the ZeRO stage over the
    mesh axes along which its parameters' gradients are partial sums (its data-parallel axes).
    ``master``: fp32 master weights beside low-precision parameters (mixed precision).
    """

    zero: int = 0
    master: bool = False
    recompute: bool = False
    saved_inputs: tuple[int, ...] = ()
    kept: bool = False


PLAIN = NodeTraining()


def node_training(node) -> NodeTraining:
    return node.attrs.get("train", PLAIN)


@dataclass(frozen=True)
class Degrees:
    """Degrees of tensor, pipeline and data parallelism per cluster level, innermost level first
    (in-node, across nodes, across pods): ``tensor[l] * pipeline[l] * data[l]`` is level l's size,
    times ``context[l]`` when given: context parallelism, each sequence split over that many ranks
    (attention gathers keys and values over them; parameters are replicated, gradients reduced
    over context x data).

    ``expert`` (empty: 1 everywhere): expert parallelism, per level a divisor of ``data[l]``: the
    routed experts' weights are split over an expert group of ``ep`` of the data-parallel devices
    (each holds ``experts / ep`` of them, tokens reach them by all-to-all), and replicated over the
    ``d / ep`` groups; everything else stays data-parallel over all ``d``."""

    tensor: tuple[int, ...]
    pipeline: tuple[int, ...]
    data: tuple[int, ...]
    context: tuple[int, ...] = ()  # () = no context parallelism
    expert: tuple[int, ...] = ()  # () = no expert parallelism
    ring: bool = False  # context parallelism's attention as a ring (K/V chunks passed on), not K/V gathered

    def __post_init__(self) -> None:
        if not (len(self.tensor) == len(self.pipeline) == len(self.data)):
            raise ValueError("Degrees: tensor, pipeline and data need one entry per level")
        if self.context and len(self.context) != len(self.data):
            raise ValueError("Degrees: context needs one entry per level (or none)")
        if self.ring and self.c <= 1:
            raise ValueError("Degrees: ring attention needs a context degree above 1")
        if self.expert and (len(self.expert) != len(self.data)
                            or any(k < 1 or d % k for k, d in zip(self.expert, self.data))):
            raise ValueError(f"Degrees: expert {self.expert} needs one divisor of data {self.data} per level")

    @property
    def t(self) -> int:
        return math.prod(self.tensor)

    @property
    def p(self) -> int:
        return math.prod(self.pipeline)

    @property
    def d(self) -> int:
        return math.prod(self.data)

    @property
    def c(self) -> int:
        return math.prod(self.context) if self.context else 1

    @property
    def ep(self) -> int:
        return math.prod(self.expert) if self.expert else 1

    @property
    def expert_data(self) -> tuple[int, ...]:
        """Per level, the data parallelism the routed experts keep (``data / expert``)."""
        return tuple(d // k for d, k in zip(self.data, self.expert)) if self.expert else self.data

    @property
    def devices(self) -> int:
        return self.t * self.c * self.p * self.d

    def describe(self, level_names=("in-node", "across nodes", "across pods")) -> str:
        def one(name, per):
            total = math.prod(per)
            where = [f"{k} {level_names[l] if l < len(level_names) else f'level {l}'}"
                     for l, k in enumerate(per) if k > 1]
            return f"{name} {total}" + (f" ({', '.join(where)})" if len(where) > 1 else
                                        f" ({where[0].split(' ', 1)[1]})" if where else "")
        context = "ring context" if self.ring else "context"
        parts = (("tensor", self.tensor),) + (((context, self.context),) if self.c > 1 else ()) + (
            ("pipeline", self.pipeline), ("data", self.data))
        text = " x ".join(one(n, v) for n, v in parts)
        return text + (f"; {one('experts over', self.expert)} of the data devices" if self.ep > 1 else "")

    def to_json(self) -> dict:
        out = {"tensor": list(self.tensor), "pipeline": list(self.pipeline), "data": list(self.data)}
        if self.c > 1:
            out["context"] = list(self.context)
        if self.ring:
            out["ring"] = True
        if self.ep > 1:
            out["expert"] = list(self.expert)
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Degrees":
        return cls(tuple(d["tensor"]), tuple(d["pipeline"]), tuple(d["data"]), tuple(d.get("context", ())),
                   tuple(d.get("expert", ())), bool(d.get("ring", False)))


@dataclass
class Strategy:
    """The training options a plan chose, where they apply, and what the step time is made of.

    ``time_terms``: seconds per component of the predicted step (compute, tensor-parallel
    communication, pipeline bubble, send/recv, data-parallel sync, ZeRO gathers, optimizer), so
    the report can say why one plan is faster than another without re-pricing. ``model_flops``:
    FLOPs of one step as the model defines them (forward + backward = 3x the forward);
    ``hardware_flops`` adds the recomputed forward; ``peak_flops``: one device's peak at the
    compute dtype. MFU = model_flops / (step time x devices x peak_flops).
    """

    options: TrainingOptions = field(default_factory=TrainingOptions)
    zero_axes: tuple[int, ...] = ()  # mesh axes the ZeRO stage shards over
    recompute: tuple[str, ...] = ()  # module paths wrapped in a checkpoint
    degrees: Degrees | None = None  # plans of the hierarchical search
    microbatch_size: int | None = None
    time_terms: dict[str, float] = field(default_factory=dict)
    memory_terms: dict[str, float] = field(default_factory=dict)  # bytes per device, peak stage
    model_flops: float = 0.0
    hardware_flops: float = 0.0
    peak_flops: float = 0.0
    notes: list[str] = field(default_factory=list)  # what the search assumed, in words
    reference: dict = field(default_factory=dict)  # a published run this plan reproduces: its figures

    def mfu(self, step_seconds: float, devices: int) -> float:
        denom = step_seconds * devices * self.peak_flops
        return self.model_flops / denom if denom > 0 else math.nan

    def hfu(self, step_seconds: float, devices: int) -> float:
        denom = step_seconds * devices * self.peak_flops
        return self.hardware_flops / denom if denom > 0 else math.nan

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["options"] = dataclasses.asdict(self.options)
        d["degrees"] = self.degrees.to_json() if self.degrees else None
        d["zero_axes"] = list(self.zero_axes)
        d["recompute"] = list(self.recompute)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Strategy":
        d = dict(d)
        d["options"] = TrainingOptions(**d.get("options", {}))
        d["degrees"] = Degrees.from_json(d["degrees"]) if d.get("degrees") else None
        d["zero_axes"] = tuple(d.get("zero_axes", ()))
        d["recompute"] = tuple(d.get("recompute", ()))
        return cls(**d)
