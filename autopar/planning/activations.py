"""How a tensor group keeps its activations beyond its time-optimal layout: sequence parallelism
and attention-only recomputation.

* Sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", 4.2.2): inside a tensor group of t devices, the ops a tensor-parallel
  layout leaves whole (norms, residuals, dropouts) run on 1/t of the sequence and a column-
  parallel linear saves its input's sequence shard, gathering it again in its backward, so every
  saved activation is 1/t. ``units.sequence_parallel_saved`` counts that per node of the group's
  layout (its saved tensors at 1/t; an all-gather per tensor the layout reads less split);
  ``price_fitting`` takes it where the plain layout's activations do not fit: the fastest of the
  two that fits.
* Attention-only ("selective") recomputation (the same paper, 5): each attention's core -- the
  product of queries and keys, its scaling, masking, softmax and dropout, and their product with
  the values: the nodes running over two sequence positions -- keeps only its inputs from outside
  the core (queries, keys, values) and runs its forward again in the backward; the linears and
  everything else save as without recomputation. ``attention_recompute`` marks those nodes the
  way ``core.blocks.apply_training`` marks a recomputed block, so the cost and memory models
  price them as any recomputed node. A fused attention kernel (``sdpa``) keeps no scores: it is
  not a core here, and a model with only such kernels gains nothing from the option.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from autopar.core.ir import Graph
from autopar.core.sequence import sequence_dims
from autopar.core.strategy import node_training
from autopar.cost_models.causal_exchange import least_work_factor
from autopar.planning.step_price import Candidate, Priced, price
from autopar.planning.units import UnitStats


def sequence_parallel(s: UnitStats) -> UnitStats:
    """The group's layout with every saved activation at 1/t, gathered again in the backward
    (``units.sequence_parallel_saved``); the gathers count as tensor-parallel communication."""
    return dataclasses.replace(s, acts=s.sp_acts, comm=s.comm + s.sp_comm)


def price_fitting(c: Candidate, s: UnitStats, *args, **kwargs) -> Priced:
    """``step_price.price`` of the fastest of the group's two ways of keeping its activations
    that fits: as its time-optimal layout saves them, or under sequence parallelism (never faster:
    the same layout plus the gathers); where neither fits, the one needing less memory. Context
    parallelism's ranks keep their own shares (``context.py``): priced as written."""
    pr = price(c, s, *args, **kwargs)
    if pr.fits or s.sp_acts is None or c.degrees.c > 1 or not np.any(s.sp_acts < s.acts * (1 - 1e-9)):
        return pr
    sp = price(c, sequence_parallel(s), *args, **kwargs)
    sp.sequence_parallel = True
    sp.bottleneck += "; sequence parallel: saved activations at 1/t of the tensor group, gathered again in the backward"
    return sp if sp.fits or sp.memory < pr.memory else pr


def attention_core(graph: Graph) -> list[int]:
    """Indices of the nodes of every attention's core: those with two or more dims along the
    sequence (``core.sequence``: the scores' query and key positions), fused kernels excepted."""
    seq = sequence_dims(graph)
    return [i for i, n in enumerate(graph.nodes) if n.op != "sdpa" and len(seq.get(n.name, ())) >= 2]


def attention_recompute(graph: Graph) -> Graph:
    """``graph`` (already under its training options) with each attention core recomputed: its
    nodes keep only their floating-point inputs from outside the core, each once, at its first
    reader (``NodeTraining.saved_inputs``, as ``apply_training`` does for a block)."""
    core = set(attention_core(graph))
    inside = {graph.nodes[i].name for i in core}
    seen: set[tuple[str, int]] = set()
    nodes = []
    for i, n in enumerate(graph.nodes):
        if i not in core:
            nodes.append(n)
            continue
        keep = []
        for k, op in enumerate(n.inputs):
            key = (op.source, op.output)
            if not (op.is_node and op.source in inside) and key not in seen \
                    and op.spec.dtype.startswith(("float", "bfloat")):
                seen.add(key)
                keep.append(k)
        rec = dataclasses.replace(node_training(n), recompute=True, saved_inputs=tuple(keep))
        nodes.append(dataclasses.replace(n, attrs={**n.attrs, "train": rec}))
    return Graph(nodes, dict(graph.inputs), list(graph.outputs), graph.model_name, graph.fx_graph)


def attention_flops(graph: Graph, least: bool = False) -> float:
    """FLOPs of one step's attention cores' forward: what attention-only recomputation re-runs;
    ``least``: at the least share of them any split runs (``causal_exchange.least_work_factor``)."""
    return float(sum(graph.nodes[i].flops * (least_work_factor(graph.nodes[i]) if least else 1.0)
                     for i in attention_core(graph)))
