"""The PaSE canonical view: a traced ``ir.Graph`` -> PaSE's coarser graph (docs/pase.md §7.5).

This is a pass of the PaSE cost model, not of the tracer: it forgets what PaSE never modelled so
that PaSE's totals can be reproduced from a plain PyTorch model.

* Unary pointwise ops (ReLU, ...) are not nodes: they are folded into their producer as a
  pointwise count ``w`` (how many per op is the profile's ``fold``; 0 drops them, as PaSE's
  Inception graph does). Binary elementwise ops (residual adds, +positional encoding) are nodes.
* Dropout and identity ops vanish; bias adds inside linear/conv are not modelled.
* A reshape is Ravel + Unravel; a reshape that only merges the leading axes of a loss's logits
  (``cross_entropy(logits.flatten(0, 1), ...)``) is folded into the loss, which sees the logits.
* ``cat`` is Concat, ``stack`` is Stack, ``unbind`` is Unstack, a whole ``nn.LSTM`` is one LSTM
  node, ``nn.Embedding`` is PaSE's one-hot Einsum, a mean over H, W is ReduceMean.
* Graph inputs, parameters, buffers and anything computed from them alone (``labels.view(-1)``)
  are not nodes and create no edges (§5).
* A producer feeding several inputs of one consumer leaves one edge, costed as the LAST input
  (PaseGraph.edges, §5 / §9.1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from autopar.core import ir

from autopar.pase.graph import PaseBuilder, PaseGraph, PaseTensor


@dataclass(frozen=True)
class PaseProfile:
    """Per-model choices PaSE's hand-written graphs made, which a trace cannot tell."""

    name: str
    cutoff: int  # PaSE's kappa for this model (§1)
    fold: Mapping[str, int] = field(default_factory=dict)  # unary pointwise fn -> w it adds
    default_fold: int = 1  # w added by a unary pointwise fn not listed in ``fold``


PROFILES: dict[str, PaseProfile] = {
    # ReLU after conv1-5 and FC6-7 counts as one pointwise op of its producer.
    "alexnet": PaseProfile("alexnet", 4, {"relu": 1}),
    # PaSE's BasicConv2d is conv (w=0) + batch norm; its ReLU is dropped entirely.
    "inception3": PaseProfile("inception3", 4, {"relu": 0}),
    "rnnlm": PaseProfile("rnnlm", 1, {}),
    # PaSE's FFN first einsum has w = 2 (bias add + ReLU in its source, though it has no bias op).
    "transformer": PaseProfile("transformer", 1, {"relu": 2}),
    "default": PaseProfile("default", 1, {}),
}

_ALIAS_OPS = ("identity", "dropout")


class PaseViewError(ValueError):
    """The traced graph has an op PaSE's model has no node for."""


@dataclass
class _View:
    graph: ir.Graph
    profile: PaseProfile
    b: PaseBuilder = field(init=False)
    env: dict[tuple[str, int], Optional[PaseTensor]] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    users: dict[str, list[ir.Node]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.b = PaseBuilder(self.profile.name if self.profile.name != "default"
                             else self.graph.model_name)
        for n in self.graph.nodes:
            for op in n.inputs:
                if op.is_node:
                    self.users.setdefault(op.source, []).append(n)

    # --- operand lookup -----------------------------------------------------------------------
    def tensor(self, op: ir.Operand) -> PaseTensor:
        """The PaSE tensor behind an operand; graph inputs and input-derived values have no node."""
        if op.is_node:
            t = self.env.get((op.source, op.output))
            if t is not None:
                return t
        return PaseTensor(None, 0, tuple(op.spec.shape))

    def from_nodes(self, ops) -> bool:
        return any(self.tensor(o).node is not None for o in ops)

    def set(self, n: ir.Node, t: Optional[PaseTensor], j: int = 0) -> None:
        self.env[(n.name, j)] = t

    def fold_into(self, t: PaseTensor, n: ir.Node, w: int) -> None:
        node = self.b.nodes[t.node]
        node.w += w
        node.sources += (n.name,)

    # --- the pass -----------------------------------------------------------------------------
    def run(self) -> PaseGraph:
        for n in self.graph.nodes:
            data = list(n.inputs)
            if not self.from_nodes(data) and n.op not in _SOURCES:
                self.dropped.append(n.name)  # computed from graph inputs only: not a PaSE node
                for j in range(len(n.outputs)):
                    self.set(n, None, j)
                continue
            handler = _HANDLERS.get(n.op)
            if handler is None:
                raise PaseViewError(f"{n.name}: op {n.op!r} ({n.target}) has no PaSE node")
            handler(self, n)
        g = self.b.graph()
        g.dropped = list(self.dropped)
        return g


def _src(n: ir.Node) -> tuple[str, ...]:
    return (n.name,)


def _alias(v: _View, n: ir.Node) -> None:
    v.set(n, v.tensor(n.inputs[0]))
    v.dropped.append(n.name)


def _elementwise(v: _View, n: ir.Node) -> None:
    fn = n.attrs.get("fn", "")
    operands = list(n.inputs) + list(n.params)
    if len(operands) == 1:
        # unary pointwise (or with a scalar): a fused op of its producer, or nothing
        t = v.tensor(n.inputs[0])
        v.fold_into(t, n, v.profile.fold.get(fn, v.profile.default_fold))
        v.set(n, t)
        return
    shape = tuple(n.outputs[0].shape)
    ins = []
    for o in operands:
        t = v.tensor(o)
        if t.node is not None and t.shape != shape:
            raise PaseViewError(f"{n.name}: PaSE's Elementwise needs equal shapes, got {t.shape}")
        ins.append(t if t.node is not None else PaseTensor(None, 0, shape))
    if len(ins) != 2:
        raise PaseViewError(f"{n.name}: PaSE's Elementwise is binary, got {len(ins)} operands")
    v.set(n, v.b.elementwise(ins[0], ins[1], sources=_src(n)))


def _linear(v: _View, n: ir.Node) -> None:
    v.set(n, v.b.fc(v.tensor(n.inputs[0]), n.outputs[0].shape[-1], sources=_src(n)))


def _einsum(v: _View, n: ir.Node) -> None:
    eq = n.attrs.get("equation") or _equation(n)
    ops = list(n.inputs) + list(n.params)
    if len(ops) != 2:
        raise PaseViewError(f"{n.name}: PaSE's Einsum has two operands, got {len(ops)}")
    x, y = _einsum_operands(eq, ops)
    v.set(n, v.b.einsum(eq, v.tensor(x), v.tensor(y), sources=_src(n)))


def _einsum_operands(eq: str, ops: list[ir.Operand]) -> tuple[ir.Operand, ir.Operand]:
    """Order two operands to match the equation's terms (the tracer lists parameters last)."""
    terms = eq.replace(" ", "").split("->")[0].split(",")
    for a, b in ((ops[0], ops[1]), (ops[1], ops[0])):
        sizes: dict[str, int] = {}
        fits = (len(a.spec.shape), len(b.spec.shape)) == (len(terms[0]), len(terms[1])) and all(
            sizes.setdefault(ch, d) == d
            for t, o in ((terms[0], a), (terms[1], b)) for ch, d in zip(t, o.spec.shape))
        if fits:
            return a, b
    raise PaseViewError(f"einsum {eq}: operand shapes do not match the equation")


def _equation(n: ir.Node) -> str:
    """Rebuild an einsum equation from the node's axis maps (one dim per axis)."""
    letters: dict[str, str] = {}

    def term(axes) -> str:
        out = ""
        for a in axes:
            if len(a) != 1:
                raise PaseViewError(f"{n.name}: einsum axis {a} is not one dim")
            d = a[0]
            letters.setdefault(d, d if len(d) == 1 else chr(ord("a") + len(letters)))
            out += letters[d]
        return out

    ins = [term(o.spec.axes) for o in list(n.inputs) + list(n.params)]
    return ",".join(ins) + "->" + term(n.outputs[0].axes)


def _conv2d(v: _View, n: ir.Node) -> None:
    weight = next(p for p in n.params if len(p.spec.shape) == 4)
    cout, cin_g, r, s = weight.spec.shape
    x = v.tensor(n.inputs[0])
    if n.attrs.get("groups", 1) != 1 or cin_g != x.shape[1]:
        raise PaseViewError(f"{n.name}: PaSE's Conv has no groups")
    if tuple(n.attrs.get("dilation", (1, 1))) != (1, 1) or isinstance(n.attrs.get("padding"), str):
        raise PaseViewError(f"{n.name}: PaSE's Conv has no dilation and numeric padding")
    out = v.b.conv(x, cout, (r, s), n.attrs.get("stride", 1), n.attrs.get("padding", 0),
                   sources=_src(n))
    _check_shape(n, out)
    v.set(n, out)


def _pool(v: _View, n: ir.Node) -> None:
    x = v.tensor(n.inputs[0])
    a = n.attrs
    if a.get("adaptive"):
        if tuple(n.outputs[0].shape) == x.shape:
            return _alias(v, n)  # adaptive pooling to the input's own size is the identity
        raise PaseViewError(f"{n.name}: adaptive pooling; use a mean over H, W (ReduceMean)")
    kernel = a.get("kernel", a.get("kernel_size"))
    stride = a.get("stride") or kernel
    out = v.b.pool(x, kernel, stride, a.get("padding", 0), a.get("kind", "max"),
                   sources=_src(n))
    _check_shape(n, out)
    v.set(n, out)


def _check_shape(n: ir.Node, t: PaseTensor) -> None:
    if tuple(n.outputs[0].shape) != t.shape:
        raise PaseViewError(f"{n.name}: PaSE's shape {t.shape} != traced {n.outputs[0].shape}")


def _norm(axis: int):
    def handler(v: _View, n: ir.Node) -> None:
        v.set(n, v.b.norm(v.tensor(n.inputs[0]), axis, sources=_src(n)))
    return handler


def _softmax(v: _View, n: ir.Node) -> None:
    axis = n.attrs.get("axis", n.attrs.get("dim", -1))
    v.set(n, v.b.softmax(v.tensor(n.inputs[0]), axis, sources=_src(n)))


def _reduce(v: _View, n: ir.Node) -> None:
    x = v.tensor(n.inputs[0])
    axes = tuple(a % len(x.shape) for a in n.attrs.get("axes", ()))
    if n.attrs.get("fn") != "mean" or n.attrs.get("keepdim") or axes != (2, 3):
        raise PaseViewError(f"{n.name}: PaSE's ReduceMean is a mean over axes (2, 3)")
    v.set(n, v.b.reduce_mean(x, axes, sources=_src(n)))


def _view(v: _View, n: ir.Node) -> None:
    x = v.tensor(n.inputs[0])
    shape = tuple(n.outputs[0].shape)
    users = v.users.get(n.name, [])
    if shape == x.shape:
        return _alias(v, n)
    if users and all(u.op == "cross_entropy" for u in users) and shape[-1] == x.shape[-1]:
        return _alias(v, n)  # merging the logits' leading axes only feeds the loss: no node
    v.set(n, v.b.reshape(x, shape, sources=_src(n)))


def _cat(v: _View, n: ir.Node) -> None:
    xs = [v.tensor(o) for o in n.inputs]
    axis = n.attrs.get("axis", n.attrs.get("dim", 0))
    if len(n.outputs[0].shape) == len(xs[0].shape) + 1 or n.op == "stack":
        out = v.b.stack(xs, axis, sources=_src(n))
    else:
        out = v.b.concat(xs, axis, sources=_src(n))
    _check_shape(n, out)
    v.set(n, out)


def _split(v: _View, n: ir.Node) -> None:
    x = v.tensor(n.inputs[0])
    axis = n.attrs.get("axis", n.attrs.get("dim", 0)) % len(x.shape)
    if len(n.outputs[0].shape) != len(x.shape) - 1:
        raise PaseViewError(f"{n.name}: only unbind (PaSE's Unstack) is modelled, not split")
    for j, t in enumerate(v.b.unstack(x, axis, sources=_src(n))):
        v.set(n, t, j)


def _embedding(v: _View, n: ir.Node) -> None:
    tokens = n.inputs[0].spec.shape
    table = next(p for p in list(n.params) + list(n.inputs[1:]) if len(p.spec.shape) == 2)
    if len(tokens) != 2:
        raise PaseViewError(f"{n.name}: PaSE's Embedding reads (batch, seq) tokens")
    vocab, width = table.spec.shape
    v.set(n, v.b.embedding(tokens, vocab, width, sources=_src(n)))


def _lstm(v: _View, n: ir.Node) -> None:
    if not n.attrs.get("batch_first", True) or n.attrs.get("bidirectional"):
        raise PaseViewError(f"{n.name}: PaSE's LSTM is batch-first and one-directional")
    layers = n.attrs.get("layers") or n.attrs.get("num_layers") or sum(1 for p in n.params if ".weight_ih_l" in p.source
                                              and not p.source.endswith("_reverse"))
    v.set(n, v.b.lstm(v.tensor(n.inputs[0]), int(layers), sources=_src(n)))
    for j in range(1, len(n.outputs)):
        v.set(n, None, j)  # final hidden/cell states: PaSE's LSTM node has one output


def _cross_entropy(v: _View, n: ir.Node) -> None:
    v.set(n, v.b.softmax_ce(v.tensor(n.inputs[0]), sources=_src(n)))


def _opaque(v: _View, n: ir.Node) -> None:
    if "stack" in n.target:
        return _cat(v, n)
    raise PaseViewError(f"{n.name}: opaque op {n.target} has no PaSE node")


_HANDLERS = {
    "identity": _alias, "dropout": _alias, "elementwise": _elementwise, "linear": _linear,
    "einsum": _einsum, "conv2d": _conv2d, "pool": _pool, "batch_norm": _norm(0),
    "layer_norm": _norm(-1), "softmax": _softmax, "log_softmax": _softmax, "reduce": _reduce,
    "view": _view, "cat": _cat, "stack": _cat, "split": _split, "embedding": _embedding,
    "lstm": _lstm, "cross_entropy": _cross_entropy, "opaque": _opaque,
}
SUPPORTED = ("linear, conv2d, pooling, batch and layer norm, softmax, einsum, LSTM, embedding, binary "
             "elementwise, reshape, cat/stack/unbind, cross-entropy")
_SOURCES = ("embedding", "conv2d", "linear", "einsum", "lstm")  # nodes even on graph inputs alone


def pase_view(graph: ir.Graph, profile: str | PaseProfile = "default") -> PaseGraph:
    """PaSE's graph of a traced model; ``profile`` names the per-model fold rules (PROFILES)."""
    prof = PROFILES[profile] if isinstance(profile, str) else profile
    try:
        return _View(graph, prof).run()
    except PaseViewError as e:  # one line: what PaSE's space is, what this model has, what to use instead
        missing = sorted({n.op for n in graph.nodes if n.op not in _HANDLERS})
        has = f"ops {', '.join(missing)} PaSE has no node for, and " if missing else ""
        raise PaseViewError(
            f"space='pase' is PaSE's own view of a graph, with the nodes of its AlexNet, Inception-v3, RNNLM and "
            f"Transformer ({SUPPORTED}); {graph.model_name or 'this model'} has {has}{e}: plan it with "
            "cost_model='analytic' (space='mesh', which splits every op autopar traces), or use PaSE's space on "
            "zoo:alexnet, zoo:inception3, zoo:rnnlm or zoo:transformer") from None
