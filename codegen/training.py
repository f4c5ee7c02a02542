"""Training options in the generated program: mixed-precision casts and per-block recomputation.

The plan's ``Strategy`` (``autopar.core.strategy``) says what the search priced; ``ProgramTraining``
is what codegen does with it (or with the options given to ``autopar.compile`` for a plan that
has none):

* mixed precision: the parameters stay fp32 (the DTensors the optimizer steps: the master
  weights); the program casts each floating parameter and floating input to the compute dtype
  right after its placeholder, so every op computes in bf16 and autograd brings the gradients
  back to fp32 through the cast (the data-parallel sync then sums fp32 gradients).
* recomputation: the program's nodes are grouped by the repeated block (``layers.3``) of the IR
  node they come from, each block cut out with ``torch.fx``'s ``split_module`` and run under
  ``torch.utils.checkpoint`` (non-reentrant): only the block's inputs are kept for the backward,
  which re-runs the block's forward, its collectives included (every rank re-runs the same ones).
  Pointwise recomputation (``selective.py``): the same blocks under selective checkpointing.
* ZeRO-1/2/3: ``zero.py`` (the gradient buckets and the sharded optimizer).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn as nn
from torch.fx.passes.split_module import split_module
from torch.utils.checkpoint import checkpoint

from autopar.core.blocks import block_path, recomputed_blocks

from .inplace import STATE_WRITE
from .selective import pointwise_checkpoint

BLOCK = "autopar_block"  # node.meta key: the recomputed block a program node belongs to


@dataclass(frozen=True)
class ProgramTraining:
    """What the program and its gradient sync do beyond the plan's splits."""

    dtype: torch.dtype | None = None  # compute dtype of mixed precision; None: the model's own
    recompute: tuple[str, ...] = ()  # block paths run under torch.utils.checkpoint
    zero: int = 0  # ZeRO stage (1: optimizer state sliced, 2: also gradients, 3: also parameters)
    zero_axes: tuple[int, ...] | None = None  # mesh axes ZeRO shards over (None: every axis a gradient sums over)
    accumulate: int = 1  # microbatches per ``train_step``, the gradients synchronized once (``accumulate.py``)
    # attention-only recomputation: (IR node, its attention core) for each node of a core
    # (``core/attention_core.py``), each core run under ``torch.utils.checkpoint`` on its own
    cores: tuple[tuple[str, str], ...] = ()
    ring: bool = False  # context-parallel attention as a ring, K/V kept in chunks (``ring_attention.py``)
    pointwise: bool = False  # the recomputed blocks keep their matmuls' outputs (``selective.py``)

    @functools.cached_property
    def _core_of(self) -> dict[str, str]:
        return dict(self.cores)

    def tag_of(self, node: str, module_path: str) -> str | None:
        """The recomputed group an IR node's program nodes belong to: its attention core, or its
        recomputed block, or None."""
        return self._core_of.get(node) or block_of(module_path, self.recompute)

    @property
    def plain(self) -> bool:
        return self.dtype is None and not self.recompute and not self.zero and not self.cores


PLAIN = ProgramTraining()


def program_training(graph, strategy=None, *, zero=None, precision=None, recompute=None,
                     accumulate=None) -> ProgramTraining:
    """The plan's strategy, with the options given to ``compile`` in its place (or over it)."""
    from autopar.core.attention_core import attention_members
    from autopar.core.strategy import PRECISIONS, RECOMPUTE_ATTENTION, RECOMPUTE_POINTWISE, TrainingOptions

    opts = strategy.options if strategy is not None else TrainingOptions()
    blocks = tuple(strategy.recompute) if strategy is not None else ()
    axes = tuple(strategy.zero_axes) if strategy is not None and strategy.zero_axes else None
    named = (RECOMPUTE_ATTENTION, RECOMPUTE_POINTWISE)
    if zero is not None or precision is not None or recompute is not None:
        opts = TrainingOptions(opts.zero if zero is None else int(zero),
                               opts.precision if precision is None else precision,
                               opts.recompute if recompute is None else
                               recompute if recompute in named else bool(recompute),
                               opts.every if recompute is None or recompute in named else max(1, int(recompute)),
                               opts.accumulate)
        if recompute is not None and recompute != RECOMPUTE_ATTENTION:  # True: every block; k: every k-th
            blocks = recomputed_blocks(graph, opts)
        if zero is not None and strategy is None:
            axes = None
    if opts.recompute and not blocks:
        blocks = recomputed_blocks(graph, opts)
    if opts.precision == "fp16":
        raise ValueError("fp16 mixed precision needs loss scaling, which codegen does not do: "
                         "compile with precision='bf16' (or 'fp32')")
    dtype = getattr(torch, PRECISIONS[opts.precision]) if opts.mixed else None
    steps = opts.accumulate if accumulate is None else int(accumulate)
    if steps < 1:
        raise ValueError(f"accumulate must be a count of microbatches >= 1, not {accumulate!r}")
    cores = tuple((graph.nodes[i].name, c) for i, c in attention_members(graph).items()) \
        if opts.recompute == RECOMPUTE_ATTENTION else ()
    ring = bool(strategy is not None and strategy.degrees is not None and strategy.degrees.ring)
    return ProgramTraining(dtype, blocks if opts.recompute != RECOMPUTE_ATTENTION else (), opts.zero,
                           axes if opts.zero else None, steps, cores, ring, opts.recompute == RECOMPUTE_POINTWISE)


def block_of(module_path: str, recompute: tuple[str, ...]) -> str | None:
    b = block_path(module_path)
    return b if b in recompute else None


def tag_new_nodes(graph: fx.Graph, mark: fx.Node, block: str | None) -> None:
    """Tag the nodes appended after ``mark`` with their block (a write into a parameter or buffer
    is left out: run again in the backward, it would write twice)."""
    node = graph._root.prev
    while node is not mark and node is not graph._root:
        if node.op not in ("placeholder", "output") and block is not None and not node.meta.get(STATE_WRITE):
            node.meta[BLOCK] = block
        node = node.prev


def cast_placeholders(graph: fx.Graph, params: list[fx.Node], inputs: list[fx.Node],
                      training: ProgramTraining) -> None:
    """Each of the parameters and inputs read through ``.to(training.dtype)`` (inserted after the
    last placeholder); under ZeRO-3 the parameters cast just before their first reader, in its
    block, by ``zero_units.cast`` (the copy made again for the backward, not kept)."""
    from .zero_units import cast

    dtype, near = training.dtype, params if training.zero == 3 else []
    placeholders = params + inputs
    order = {n: i for i, n in enumerate(graph.nodes)}
    for ph in near:
        users = list(ph.users)
        if not users:
            continue
        first = min(users, key=lambda u: order[u])
        with graph.inserting_before(first):
            made = graph.call_function(cast, (ph, dtype))
        if BLOCK in first.meta:
            made.meta[BLOCK] = first.meta[BLOCK]
        for u in users:
            u.replace_input_with(ph, made)
    placeholders = [ph for ph in placeholders if ph not in set(near)]
    if not placeholders:
        return
    last = [n for n in graph.nodes if n.op == "placeholder"][-1]
    at = last
    for ph in placeholders:
        users = list(ph.users)
        with graph.inserting_after(at):
            cast = graph.call_method("to", (ph, dtype))
        at = cast
        for u in users:
            u.replace_input_with(ph, cast)


class Recomputed(nn.Module):
    """One block of the program, its forward re-run in the backward (``torch.utils.checkpoint``);
    ``pointwise``: only its pointwise ops, the matmuls' outputs kept (``selective.py``)."""

    def __init__(self, inner: fx.GraphModule, block: str, pointwise: bool = False):
        super().__init__()
        self.inner = inner
        self.block = block
        self.pointwise = pointwise

    def forward(self, *args):
        if self.pointwise:
            return pointwise_checkpoint(self.inner, *args)
        return checkpoint(self.inner, *args, use_reentrant=False)

    def extra_repr(self) -> str:
        return f"recomputed block {self.block}" + (" (pointwise)" if self.pointwise else "")


def recompute_blocks(gm: fx.GraphModule, pointwise: bool = False) -> fx.GraphModule:
    """``gm`` with each run of nodes tagged with one block as a ``Recomputed`` submodule (the
    untagged runs as plain submodules between them); ``gm`` itself when nothing is tagged.
    ``pointwise``: each under selective checkpointing (``selective.py``)."""
    segment, last, blocks = -1, object(), {}

    def part_of(node: fx.Node) -> int:
        nonlocal segment, last
        b = node.meta.get(BLOCK)
        if b != last:
            segment, last = segment + 1, b
            blocks[segment] = b
        return segment

    if not any(BLOCK in n.meta for n in gm.graph.nodes):
        return gm
    parts = {n: part_of(n) for n in gm.graph.nodes if n.op not in ("placeholder", "output")}
    split = split_module(gm, gm, lambda n: parts[n], keep_original_order=True, keep_original_node_name=True)
    for name, sub in list(split.named_children()):
        if name.startswith("submod_") and blocks.get(int(name[7:])) is not None:
            setattr(split, name, Recomputed(sub, blocks[int(name[7:])], pointwise))
    before = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    after = [n.name for n in split.graph.nodes if n.op == "placeholder"]
    if before != after:  # the caller feeds the state and inputs in the unsplit order
        raise RuntimeError(f"recompute: split_module reordered the program's inputs ({before} -> {after})")
    return split
