"""What particular ops need beyond their local shards, keyed by what the op is.

* A mean over a split dim (``cross_entropy(reduction="mean")``, ``mean``, average pooling) would
  make every device divide by its local count: scaling the local result by 1/parts turns partial
  *means* into partial *sums*, so the ``Partial`` output sums to the global mean and its gradient
  (which DTensor hands back replicated) gets the 1/parts it needs.
* Causal attention with its query rows split must mask by *global* positions: the local call gets
  an explicit mask for its rows instead of ``is_causal``; with an even number of rows per rank,
  its rows are first exchanged for a balanced share of the work (``causal_balance``).
* An embedding whose vocabulary is split (a reduction in the IR: the shards' outputs sum to the
  answer) looks up only the indices its row shard owns and contributes zeros for the others
  (Megatron's vocab-parallel embedding).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.fx as fx

from autopar.core.ir import Node
from autopar.core.loss_lead import counts_targets
from autopar.core.sequence import balanced_causal

from .causal_balance import Balance
from .counted import CountedMean
from .moves import axes_group
from .placements import LayoutError, NodeLayout
from .ring_attention import Ring, ring_layouts, runs_ring  # noqa: F401 (ring_layouts: for program.py)

MEAN_LOSSES = {"cross_entropy", "nll_loss", "mse_loss", "l1_loss", "binary_cross_entropy",
               "binary_cross_entropy_with_logits", "smooth_l1_loss", "kl_div"}


def call_name(n: fx.Node) -> str:
    """The bare name of what an fx node calls: ``view``, ``cross_entropy``, a module path, ...
    (an ATen overload by its packet: ``aten.view.default`` -> ``view``)."""
    if n.op == "call_method":
        return str(n.target)
    if isinstance(n.target, torch._ops.OpOverload):
        return n.target.overloadpacket.__name__
    if n.op == "call_function":
        return getattr(n.target, "__name__", str(n.target))
    return str(n.target)


def mean_scale(n: fx.Node, node: Node, layout: NodeLayout) -> float:
    """1/parts of the split dims the op averages over (1.0 when it averages over none); for an
    unevenly cut batch dim, this rank's share of it (its rows over the whole batch: a mean over an
    uneven split is the sum of the parts' means weighted by their sizes, not their average)."""
    dims = mean_dims(n, node)
    scale = 1.0
    for d in dims:
        if d in layout.uneven:
            whole, mine, _ = layout.uneven[d]
            scale *= mine / whole
        else:
            scale /= layout.split_counts.get(d, 1)
    return scale


def mean_dims(n: fx.Node, node: Node) -> set[str]:
    """The reduction dims a node averages (rather than sums) over."""
    name = call_name(n)
    reductions = {d.name for d in node.dims if d.reduction}
    if node.op == "cross_entropy" or name in MEAN_LOSSES:
        if _reduction_kwarg(n, node) != "mean":
            return set()
        # averaged over the target's items; the class dim (absent from the target) is not
        target = node.inputs[1].spec.axes if len(node.inputs) > 1 else ()
        in_target = {d for axis in target for d in axis}
        return reductions & in_target if in_target else reductions
    if name == "mean" or node.attrs.get("fn") == "mean" or node.attrs.get("reduce") == "mean":
        return reductions
    if node.op == "pool" and node.attrs.get("kind") == "avg":
        return reductions
    return set()


def _reduction_kwarg(n: fx.Node, node: Node) -> str:
    if "reduction" in node.attrs:
        return str(node.attrs["reduction"])
    return str(n.kwargs.get("reduction", "mean"))


def vocab_shard(node: Node, layout: NodeLayout, mesh_shape, coord) -> tuple[int, int, int | None] | None:
    """(first row, rows, padding row or None) of this device's shard of a vocabulary-split
    embedding, else None."""
    if node.op != "embedding":
        return None
    vocab = next((d for d in node.dims if d.reduction), None)
    if vocab is None or layout.split_counts.get(vocab.name, 1) == 1:
        return None
    pad = node.attrs.get("padding_idx")
    pad = None if pad is None or int(pad) < 0 else int(pad)
    index = 0  # the shard index: the mesh axes cutting the vocabulary, first one major
    for a, dim in enumerate(layout.axis_dims):
        if dim == vocab.name:
            index = index * mesh_shape[a] + coord[a]
    rows = vocab.size // layout.split_counts[vocab.name]
    return index * rows, rows, pad


def causal_rows(node: Node, layout: NodeLayout, index: Callable[[str], int]):
    """(first row, rows) of this device's query positions in a causal sdpa whose ``l`` is cut."""
    if node.op != "sdpa" or not node.attrs.get("is_causal"):
        return None
    parts = layout.split_counts.get("l", 1)
    if parts == 1:
        return None
    rows = node.dim("l").size // parts
    return index("l") * rows, rows


def balance_of(node: Node, layout, mesh, index, ring: bool = False) -> Balance | Ring | None:
    """The ``causal_balance.Balance`` of a causal sdpa (``is_causal`` or an explicit mask: HF's causal one) whose
    query rows are cut into an even number of rows per rank; with ``ring``, the ``ring_attention.Ring``
    of an attention that runs as one (``runs_ring``); None for any other node."""
    parts = layout.split_counts.get("l", 1)
    if ring and runs_ring(node, layout):
        return Ring(parts, index("l"), axes_group(mesh, tuple(a for a, d in enumerate(layout.axis_dims) if d == "l")))
    if not balanced_causal(node, parts) or "l" in layout.uneven:
        return None
    axes = tuple(a for a, d in enumerate(layout.axis_dims) if d == "l")
    return Balance(parts, index("l"), axes_group(mesh, axes))


def causal_mask(n: fx.Node, args, kwargs, first: int, rows: int):
    """Swap ``is_causal=True`` for the bool mask of global rows ``first..first+rows``."""
    names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale"]
    bound = dict(zip(names, args))
    bound.update(kwargs)
    q, k = bound["query"], bound["key"]
    if bound.get("attn_mask") is not None:
        raise LayoutError(f"{n.name}: is_causal together with attn_mask")
    keys = torch.arange(k.shape[-2], device=q.device)
    mine = torch.arange(first, first + rows, device=q.device)
    bound["attn_mask"] = keys[None, :] <= mine[:, None]
    bound["is_causal"] = False
    return (), bound


def own_rows(n: fx.Node, args: tuple, kwargs: dict, first: int, rows: int, pad: int | None):
    """The embedding call on this shard: its indices (the integer tensor argument: first for
    ``F.embedding`` and a module, second for ``aten.embedding``) shifted into the shard, the
    padding row given in shard coordinates (-1 / None where another shard holds it); and the
    indices it does not own, whose rows the caller zeroes."""
    pos = next(i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and not a.is_floating_point())
    idx = args[pos] - first
    outside = (idx < 0) | (idx >= rows)
    args = list(args)
    args[pos] = idx.masked_fill(outside, 0)
    local_pad = pad - first if pad is not None and first <= pad < first + rows else None
    if pad is not None:
        aten = isinstance(n.target, torch._ops.OpOverload)
        if aten:
            args[2] = -1 if local_pad is None else local_pad
        elif "padding_idx" in kwargs or len(args) <= 2:
            kwargs = {**kwargs, "padding_idx": local_pad}
        else:
            args[2] = local_pad
    return tuple(args), kwargs, outside, local_pad


def whole_dropout(n: fx.Node, node: Node, layout: NodeLayout, module) -> float | None:
    """The drop probability of an element-wise dropout to run as one device would: every rank
    draws the mask of the WHOLE tensor (same seed, same draws as the single-device model, which
    CPU dropout makes with ``empty_like(x).bernoulli_(1 - p)``) and keeps its shard's part. So a
    sharded tensor's shards get different masks and a replicated one the same mask everywhere (a
    local draw per rank would give shards of one batch the same mask, and replicas different
    ones). None when the local op is right as it is (not training, nothing split, feature dropout,
    a minor-dim cut)."""
    import torch.nn as nn

    if node.op != "dropout" or not node.attrs.get("training", True):
        return None
    p = float(node.attrs.get("p", 0.5))
    if not 0.0 < p < 1.0 or all(c == 1 for c in layout.split_counts.values()):
        return None
    plain = (type(module) is nn.Dropout) if n.op == "call_module" else call_name(n) == "dropout"
    if not plain or any(layout.input_strided) or any(layout.output_strided):
        return None
    spec = node.inputs[0].spec
    if any(layout.split_counts.get(d, 1) > 1 for axis in spec.axes for d in axis[1:]):
        return None
    return p


def dropout_slice(x: torch.Tensor, node: Node, layout: NodeLayout, index, p: float) -> torch.Tensor:
    """``x`` (this rank's shard) dropped with its part of the whole tensor's mask."""
    spec = node.inputs[0].spec
    mask = torch.empty(spec.shape, dtype=x.dtype, device=x.device).bernoulli_(1 - p)
    for axis, dims in enumerate(spec.axes):
        if dims and dims[0] in layout.uneven:  # this rank's rows of an uneven batch
            whole, mine, offset = layout.uneven[dims[0]]
            inner = spec.shape[axis] // whole
            mask = mask.narrow(axis, offset * inner, mine * inner)
        elif dims and layout.split_counts.get(dims[0], 1) > 1:
            chunk = spec.shape[axis] // layout.split_counts[dims[0]]
            mask = mask.narrow(axis, index(dims[0]) * chunk, chunk)
    return x * mask.div_(1 - p)


def counted_mean(node: Node, layout: NodeLayout, mesh) -> CountedMean | None:
    """For a cross-entropy over class indices averaged over split items: what its count of
    counted targets needs (``counted.py``: the loss is then the mean over the WHOLE batch's
    counted items, each shard's local mean weighted by its share of the count), else None.
    Scaling by 1/parts (``mean_scale``) would be wrong wherever the ignored targets fall
    unevenly over the shards."""
    if not counts_targets(node):
        return None
    reductions = {d.name for d in node.dims if d.reduction}
    axes = tuple(a for a, d in enumerate(layout.axis_dims) if d in reductions and layout.split_counts.get(d, 1) > 1)
    if not axes:
        return None
    return CountedMean(int(node.attrs.get("ignore_index", -100)), axes, mesh)
