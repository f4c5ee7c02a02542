"""The op families: each op autopar understands, once, with every part of it each layer holds.

An op family is a split rule (``autopar/frontend/rules/``: how a traced call becomes an
``ir.Node`` with an iteration space) and the node kinds (``Node.op``) it emits; to price a node
by measurement, a runner that rebuilds it alone on its local shards (``cost_models/runners.py``),
or the reason it is priced analytically; what its local call needs beyond its shards in the
compiled program (``codegen``: a vocabulary shard, a causal mask's rows, a mean's scale); and
which of its calls the K-model fusion rewrites with a rule of their own
(``autopar.fusion.nn_rules.FUNCTIONAL``).

Core imports nothing above it, so a family *names* its parts; each layer finds its own part by
the family's name (the frontend's ``RULES``, the cost models' ``RUNNERS``), and
``tests/core/test_op_families.py`` resolves every name: a part named here and missing there, or
a layer's part no family names (a typo, a forgotten line), fails it.

Adding a family: a rule module in ``autopar/frontend/rules/`` (with a ``SITES`` table for the
calls that reach it) and one line here; a runner, a repair or a fusion rule where the op needs
one, named on the same line. ``docs/architecture.md`` walks through one.
"""

from __future__ import annotations

from dataclasses import dataclass

FX_KINDS = ("placeholder", "get_attr", "call_function", "call_method", "call_module", "output")


@dataclass(frozen=True)
class OpFamily:
    """One family. ``name`` is its split rule's key (``autopar.frontend.rules.RULES[name]``)."""

    name: str
    rule: str  # "module.function" under autopar.frontend.rules
    ops: tuple[str, ...] = ()  # the Node.op kinds it owns; () where its rule emits other families' kinds
    runner: str = ""  # function of autopar.cost_models.runners that runs one of its nodes alone
    analytic: str = ""  # or why its nodes are priced analytically (the profiled model keeps the estimate)
    repairs: tuple[str, ...] = ()  # "module.name" under autopar.codegen its local call may need
    fusion: tuple[str, ...] = ()  # call names whose fusion rule is its own (autopar.fusion.nn_rules.FUNCTIONAL)


NOT_RUN = "not profiled: priced analytically (no runner rebuilds it yet)"
_ADD = "placements.ADDITIVE_OPS"  # a contraction's additive terms, added by one device only
_MEAN = "op_fixes.mean_dims"  # a mean over a split dim: partial means scaled into partial sums
_POOLS = tuple(f"{kind}_pool{n}d" for kind in ("max", "avg", "adaptive_avg") for n in (1, 2, 3)) + (
    "adaptive_max_pool1d", "adaptive_max_pool2d")
# losses and resampling the fusion rewrites, which the split rules leave opaque (replicated)
_OPAQUE_FUSED = ("nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
                 "binary_cross_entropy_with_logits", "interpolate")

FAMILIES: tuple[OpFamily, ...] = (
    OpFamily("linear", "matmul.linear", ("linear",), "linear", repairs=(_ADD,), fusion=("linear",)),
    OpFamily("matmul", "matmul.matmul", ("matmul",), "einsum", repairs=(_ADD,)),
    OpFamily("einsum", "matmul.einsum", ("einsum",), "einsum", repairs=(_ADD,)),
    OpFamily("conv", "conv.conv", ("conv1d", "conv2d", "conv3d"), "conv", repairs=(_ADD, "values.local_groups"),
             fusion=("conv1d", "conv2d", "conv3d")),
    OpFamily("embedding", "embedding.embedding", ("embedding",), "embedding", repairs=("op_fixes.vocab_shard",),
             fusion=("embedding",)),
    OpFamily("layer_norm", "norm.layer_norm", ("layer_norm",), "layer_norm", fusion=("layer_norm",)),
    OpFamily("batch_norm", "norm.batch_norm", ("batch_norm",), "batch_norm",
             repairs=("batchnorm.needs_sync", "batchnorm.needs_sync_op"), fusion=("batch_norm",)),
    OpFamily("softmax", "softmax.softmax", ("softmax", "log_softmax"), "softmax"),
    OpFamily("topk", "topk.topk", ("topk",), analytic=NOT_RUN),
    OpFamily("sort", "sort.sort", ("sort",), analytic=NOT_RUN),
    OpFamily("histc", "histc.histc", ("histc",), analytic=NOT_RUN),
    OpFamily("moe_experts", "moe.moe_experts", ("moe_experts",), analytic=NOT_RUN, repairs=("experts.runs_experts",)),
    OpFamily("sdpa", "attention.sdpa", ("sdpa",), "sdpa", repairs=("op_fixes.causal_rows", "ring_attention.runs_ring"),
             fusion=("scaled_dot_product_attention",)),
    OpFamily("elementwise", "elementwise.elementwise", ("elementwise",), "elementwise"),
    OpFamily("dropout", "elementwise.dropout", ("dropout",), "dropout", repairs=("op_fixes.whole_dropout",),
             fusion=("dropout2d",)),
    OpFamily("reduce", "reduce.reduce", ("reduce",), "reduce", repairs=(_MEAN,)),
    OpFamily("scan", "reduce.scan", ("scan",), analytic=NOT_RUN),
    OpFamily("index", "indexing.index"),  # tensor indexing: a gather node
    OpFamily("gather", "indexing.gather", ("gather",), analytic=NOT_RUN),
    OpFamily("index_select", "indexing.index_select"),  # a gather node
    OpFamily("pad", "indexing.pad", ("pad",), analytic=NOT_RUN),
    OpFamily("positional", "indexing.positional"),  # triu/tril: an elementwise node
    OpFamily("view", "shape.view", ("view",), "reshape"),
    OpFamily("permute", "shape.permute", ("permute",), "permute"),
    OpFamily("identity", "shape.identity", ("identity",), "reshape"),
    OpFamily("slice", "shape.slice_", ("slice",), "slice_"),
    OpFamily("cat", "concat.cat", ("cat",), "cat"),
    OpFamily("split", "concat.split", ("split",), "split"),
    OpFamily("stack", "concat.stack"),  # a cat node with a new axis
    OpFamily("pool", "pool.pool", ("pool",), "pool", repairs=(_MEAN,), fusion=_POOLS),
    OpFamily("lstm", "lstm.lstm", ("lstm",), "lstm", repairs=("placements.WHOLE_DIMS",)),
    OpFamily("gru", "recurrent.gru", ("gru",), analytic=NOT_RUN),
    OpFamily("rnn", "recurrent.rnn", ("rnn",), analytic=NOT_RUN),
    OpFamily("mha", "mha.mha", ("mha",), analytic=NOT_RUN),
    OpFamily("cross_entropy", "loss.cross_entropy", ("cross_entropy",), "cross_entropy",
             repairs=(_MEAN, "op_fixes.counted_mean"),
             fusion=("cross_entropy",)),
    OpFamily("opaque", "opaque.opaque", ("opaque",),
             analytic="replicated: no split rule; its time is the analytic estimate of the whole op",
             fusion=_OPAQUE_FUSED),
)


def op_kinds(families: tuple[OpFamily, ...] = FAMILIES) -> dict[str, OpFamily]:
    """Node.op kind -> the family that owns it."""
    return {op: f for f in families for op in f.ops}
