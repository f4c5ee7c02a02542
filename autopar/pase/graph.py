"""PaSE's own graph: nodes with an iteration space D, a configuration domain C and tensor maps.

PaSE does not cost autopar's ir.Graph directly: it costs a coarser graph in which ReLUs are folded
into their producers, a reshape is two nodes, an LSTM is one node, and graph inputs (data, weights,
positional encodings) are not nodes (docs/pase.md §4, §5, §7). ``PaseGraph`` is that graph;
``PaseBuilder`` creates its nodes op by op with PaSE's domains, so the view pass
(``pase_view.py``) and hand-built reference graphs (tests) share one definition of every op.

A *tensor map* says how a node configuration ``c`` (one split count per entry of D) becomes the
configuration of one tensor it reads or writes: entry ``i`` of the tensor configuration is the
product of ``c[j]`` over ``j in map[i]`` (an empty tuple means 1). Every op of pase.md §4 is such a
select / permute / delete / multiply of ``c``, which lets all edge costs be computed one way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

TensorMap = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class PaseTensor:
    """A tensor flowing between PaSE nodes: producer id (None = graph input), output index, shape."""

    node: Optional[int]
    output: int
    shape: tuple[int, ...]


@dataclass
class PaseNode:
    """One PaSE op. ``domain`` is D in PaSE's printing order; ``config_domain`` is C (§3)."""

    id: int
    op: str
    domain: tuple[int, ...]
    config_domain: tuple[int, ...]
    inputs: tuple[PaseTensor, ...]
    in_maps: tuple[TensorMap, ...]
    out_shapes: tuple[tuple[int, ...], ...]
    out_maps: tuple[TensorMap, ...]
    batch_axis: int  # D index split by pure data parallelism (§8)
    w: int = 0  # fused pointwise-op count (Conv, FC, Einsum, LSTM, Elementwise)
    attrs: dict[str, Any] = field(default_factory=dict)
    sources: tuple[str, ...] = ()  # names of the ir nodes this node was made from

    def output(self, j: int = 0) -> PaseTensor:
        return PaseTensor(self.id, j, self.out_shapes[j])


@dataclass(frozen=True)
class PaseEdge:
    """The one edge u -> v left after PaSE's simple-graph collapse (§5): the LAST input wins."""

    src: int
    dst: int
    src_output: int
    dst_input: int
    shape: tuple[int, ...]


@dataclass
class PaseGraph:
    nodes: list[PaseNode]
    name: str = ""
    dropped: list[str] = field(default_factory=list)  # ir nodes the view folded away or ignored

    @property
    def edges(self) -> dict[tuple[int, int], PaseEdge]:
        out: dict[tuple[int, int], PaseEdge] = {}
        for v in self.nodes:
            for i, t in enumerate(v.inputs):
                if t.node is not None:  # graph inputs create no edges
                    out[(t.node, v.id)] = PaseEdge(t.node, v.id, t.output, i, t.shape)
        return out

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    def signature(self) -> list[tuple]:
        """Everything the cost depends on, node by node (for comparing two graphs)."""
        return [
            (n.op, n.domain, n.config_domain, n.in_maps, n.out_maps, n.w, n.batch_axis,
             tuple((t.node, t.output, t.shape) for t in n.inputs),
             tuple(sorted((k, v) for k, v in n.attrs.items())))
            for n in self.nodes
        ]


def _ident(rank: int) -> TensorMap:
    return tuple((i,) for i in range(rank))


def _without(m: TensorMap, drop: int) -> TensorMap:
    return tuple(e for i, e in enumerate(m) if i != drop)


def conv_out(size: int, kernel: int, stride: int, pad: int) -> int:
    """Output extent of a convolution/pooling window, truncating like PaSE (§4.1)."""
    return int((size - kernel + 2 * pad) / stride) + 1


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


@dataclass
class PaseBuilder:
    """Creates PaSE nodes in order (ids 0, 1, ...), each with its §4 domain and tensor maps."""

    name: str = ""
    nodes: list[PaseNode] = field(default_factory=list)

    def graph(self) -> PaseGraph:
        return PaseGraph(list(self.nodes), self.name)

    @staticmethod
    def input(shape) -> PaseTensor:
        return PaseTensor(None, 0, tuple(shape))

    def _add(self, op, domain, inputs, in_maps, out_shapes, out_maps, batch_axis=0, *,
             config_domain=None, w=0, attrs=None, sources=()) -> PaseNode:
        node = PaseNode(
            id=len(self.nodes), op=op, domain=tuple(domain),
            config_domain=tuple(domain if config_domain is None else config_domain),
            inputs=tuple(inputs), in_maps=tuple(in_maps), out_shapes=tuple(map(tuple, out_shapes)),
            out_maps=tuple(out_maps), batch_axis=batch_axis, w=w, attrs=dict(attrs or {}),
            sources=tuple(sources))
        self.nodes.append(node)
        return node

    # --- GEMM-like ops -------------------------------------------------------------------------
    def conv(self, x: PaseTensor, n_out: int, kernel, stride=1, pad=0, w=0, sources=()):
        """§4.1: D = (b, C_in, H_o, W_o, R, S, N); H_o, W_o are never split."""
        b, cin, h, wd = x.shape
        (r, s), (sh, sw), (ph, pw) = _pair(kernel), _pair(stride), _pair(pad)
        ho, wo = conv_out(h, r, sh, ph), conv_out(wd, s, sw, pw)
        dom = (b, cin, ho, wo, r, s, n_out)
        return self._add("Conv", dom, [x], [_ident(4)], [(b, n_out, ho, wo)],
                         [((0,), (6,), (2,), (3,))], 0, config_domain=(b, cin, 1, 1, r, s, n_out),
                         w=w, sources=sources).output()

    def fc(self, x: PaseTensor, n_out: int, w=0, sources=()):
        """§4.4: D = (x_1..x_j, N, K); input config drops N, output config drops K."""
        *lead, k = x.shape
        j = len(lead)
        dom = (*lead, n_out, k)
        in_map = tuple((i,) for i in range(j)) + ((j + 1,),)
        out_map = tuple((i,) for i in range(j)) + ((j,),)
        return self._add("FC", dom, [x], [in_map], [(*lead, n_out)], [out_map], 0, w=w,
                         sources=sources).output()

    def einsum(self, eq: str, x: PaseTensor, y: PaseTensor, w=0, op="Einsum", sources=(),
               reduction_order: str | None = None):
        """§4.5: D = output letters, then reduction letters (their order never changes a cost)."""
        lhs, out = eq.replace(" ", "").split("->")
        i1, i2 = lhs.split(",")
        ext = {}
        for letters, t in ((i1, x), (i2, y)):
            if len(letters) != len(t.shape):
                raise ValueError(f"einsum {eq}: operand {letters} has shape {t.shape}")
            for ch, n in zip(letters, t.shape):
                if ext.setdefault(ch, n) != n:
                    raise ValueError(f"einsum {eq}: letter {ch} has sizes {ext[ch]} and {n}")
        red = [ch for ch in i1 + i2 if ch in i1 and ch in i2 and ch not in out]
        red = list(dict.fromkeys(reduction_order or red))
        if set(red) != {ch for ch in i1 if ch in i2 and ch not in out}:
            raise ValueError(f"einsum {eq}: reduction order {reduction_order!r} is wrong")
        m_letters = [ch for ch in i1 if ch not in i2]
        n_letters = [ch for ch in i2 if ch not in i1]
        if not m_letters or not n_letters or any(ch not in out for ch in m_letters + n_letters):
            raise ValueError(f"einsum {eq}: PaSE needs >=1 m- and n-letter, all in the output")
        letters = out + "".join(red)
        pos = {ch: i for i, ch in enumerate(letters)}
        dom = tuple(ext[ch] for ch in letters)
        # §8: the batch is letter b, except in the embedding's "abc,cd->abd" (there b = sequence)
        batch_letter = "b" if "b" in out and op != "Embedding" else out[0]
        inputs = [] if op == "Embedding" else [x, y]
        in_maps = [] if op == "Embedding" else [tuple((pos[c],) for c in s) for s in (i1, i2)]
        return self._add(op, dom, inputs, in_maps, [tuple(ext[c] for c in out)],
                         [tuple((pos[c],) for c in out)], pos[batch_letter], w=w,
                         attrs={"eq": f"{i1},{i2}->{out}", "letters": letters},
                         sources=sources).output()

    def embedding(self, tokens_shape, vocab: int, width: int, sources=()):
        """§4.6: a one-hot einsum ``abc,cd->abd``; both operands are graph inputs (no edges)."""
        b, s = tokens_shape
        return self.einsum("abc,cd->abd", self.input((b, s, vocab)), self.input((vocab, width)),
                           op="Embedding", sources=sources)

    def lstm(self, x: PaseTensor, layers: int, sources=()):
        """§4.7: D = (layers, seq, batch, n, k); seq is never split; w = 3 (the gate pointwise ops)."""
        bsz, seq, units = x.shape
        dom = (layers, seq, bsz, units, units)
        return self._add("LSTM", dom, [x], [((2,), (1,), (4,))], [x.shape], [((2,), (1,), (3,))],
                         2, config_domain=(layers, 1, bsz, units, units), w=3,
                         sources=sources).output()

    # --- pointwise, normalisation and loss -----------------------------------------------------
    def elementwise(self, x: PaseTensor, y: PaseTensor | None = None, w=0, sources=()):
        """§4.8: binary op on equal shapes; a graph-input operand adds no edge."""
        shape = x.shape
        ins = [x] + ([y] if y is not None else [])
        return self._add("Elementwise", shape, ins, [_ident(len(shape))] * len(ins), [shape],
                         [_ident(len(shape))], 0, w=w, sources=sources).output()

    def norm(self, x: PaseTensor, axis: int, sources=()):
        axis = axis % len(x.shape)
        return self._add("Norm", x.shape, [x], [_ident(len(x.shape))], [x.shape],
                         [_ident(len(x.shape))], 0, attrs={"axis": axis}, sources=sources).output()

    def softmax(self, x: PaseTensor, axis: int, sources=()):
        axis = axis % len(x.shape)
        return self._add("Softmax", x.shape, [x], [_ident(len(x.shape))], [x.shape],
                         [_ident(len(x.shape))], 0, attrs={"axis": axis}, sources=sources).output()

    def softmax_ce(self, x: PaseTensor, sources=()):
        """§4.13: class axis last; the loss node's output feeds nothing."""
        r = len(x.shape)
        return self._add("SoftmaxCrossEntropy", x.shape, [x], [_ident(r)], [x.shape], [_ident(r)],
                         0, sources=sources).output()

    def pool(self, x: PaseTensor, kernel, stride=None, pad=0, kind="max", sources=()):
        """§4.2: D = output (b, C, H_o, W_o); the input tensor is read with the same config."""
        b, c, h, wd = x.shape
        (r, s), (ph, pw) = _pair(kernel), _pair(pad)
        sh, sw = _pair(stride if stride is not None else kernel)
        ho, wo = conv_out(h, r, sh, ph), conv_out(wd, s, sw, pw)
        return self._add("Pool", (b, c, ho, wo), [x], [_ident(4)], [(b, c, ho, wo)], [_ident(4)],
                         0, attrs={"H": h, "W": wd, "R": r, "S": s, "kind": kind},
                         sources=sources).output()

    def reduce_mean(self, x: PaseTensor, axes=(2, 3), sources=()):
        axes = tuple(sorted(a % len(x.shape) for a in axes))
        keep = tuple(i for i in range(len(x.shape)) if i not in axes)
        return self._add("ReduceMean", x.shape, [x], [_ident(len(x.shape))],
                         [tuple(x.shape[i] for i in keep)], [tuple((i,) for i in keep)], 0,
                         attrs={"axes": axes}, sources=sources).output()

    # --- data movement -------------------------------------------------------------------------
    def concat(self, xs: list[PaseTensor], axis: int, sources=()):
        """§4.9: D = first input's shape with the concat axis pinned to 1."""
        r = len(xs[0].shape)
        axis %= r
        dom = tuple(1 if i == axis else n for i, n in enumerate(xs[0].shape))
        out = tuple(sum(x.shape[axis] for x in xs) if i == axis else n
                    for i, n in enumerate(xs[0].shape))
        return self._add("Concat", dom, xs, [_ident(r)] * len(xs), [out], [_ident(r)], 0,
                         attrs={"axis": axis}, sources=sources).output()

    def reshape(self, x: PaseTensor, shape, sources=()):
        """§4.10: a reshape is Ravel(x) then Unravel(to shape), joined by a 1-D edge."""
        shape = tuple(shape)
        if math.prod(shape) != math.prod(x.shape):
            raise ValueError(f"reshape {x.shape} -> {shape}")
        flat = (math.prod(x.shape),)
        rx = len(x.shape)
        t = self._add("Ravel", x.shape, [x], [_ident(rx)], [flat], [(tuple(range(rx)),)], 0,
                      sources=sources).output()
        ry = len(shape)
        return self._add("Unravel", shape, [t], [(tuple(range(ry)),)], [shape], [_ident(ry)], 0,
                         sources=sources).output()

    def stack(self, xs: list[PaseTensor], axis: int = 0, sources=()):
        """§4.11: D = X with a 1 inserted at the axis; inputs read c without that entry."""
        r = len(xs[0].shape) + 1
        axis %= r
        dom = xs[0].shape[:axis] + (1,) + xs[0].shape[axis:]
        out = xs[0].shape[:axis] + (len(xs),) + xs[0].shape[axis:]
        return self._add("Stack", dom, xs, [_without(_ident(r), axis)] * len(xs), [out],
                         [_ident(r)], 1, attrs={"axis": axis}, sources=sources).output()

    def unstack(self, x: PaseTensor, axis: int = 0, sources=()) -> list[PaseTensor]:
        r = len(x.shape)
        axis %= r
        dom = tuple(1 if i == axis else n for i, n in enumerate(x.shape))
        part = x.shape[:axis] + x.shape[axis + 1:]
        m = x.shape[axis]
        node = self._add("Unstack", dom, [x], [_ident(r)], [part] * m,
                         [_without(_ident(r), axis)] * m, 1, attrs={"axis": axis}, sources=sources)
        return [node.output(j) for j in range(m)]
