"""PaSE's layer costs L(c) (docs/pase.md §2 and §4), vectorised over configurations.

Every function takes a node and ``c``, a float64 array of shape (n_configs, len(D)), and returns
the n_configs layer costs in PaSE's FLOP-equivalent units; ``r`` converts words to FLOP. Extents
are exact real quotients d / c (no integer division), as in PaSE.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from autopar.pase.graph import PaseNode


def all_reduce(words, parts, r: float):
    """AR(W, P) = r * (W / P) * 2 * (P - 1): a ring all-reduce, 0 when P = 1."""
    return r * (words / parts) * 2.0 * (parts - 1.0)


def gemm(batch, m, n, k, pm, pn, pk, w, r: float):
    """Forward, input-gradient and weight-gradient GEMMs, w pointwise ops, three all-reduces."""
    body = (3.0 * m * n * k + 3.0 * w * m * n
            + all_reduce(m * n, pk, r) + all_reduce(m * k, pn, r) + all_reduce(n * k, pm, r))
    return batch * body


def _q(node: PaseNode, c: np.ndarray) -> np.ndarray:
    return np.asarray(node.domain, dtype=np.float64)[None, :] / c


def conv_cost(node: PaseNode, c, r):
    d = node.domain  # (b, C_in, H_o, W_o, R, S, N)
    pm = c[:, 0] * c[:, 2] * c[:, 3]
    pk = c[:, 1] * c[:, 4] * c[:, 5]
    pn = c[:, 6]
    m = d[0] * d[2] * d[3] / pm
    k = d[1] * d[4] * d[5] / pk
    return gemm(1.0, m, d[6] / pn, k, pm, pn, pk, node.w, r)


def fc_cost(node: PaseNode, c, r):
    j = len(node.domain) - 2  # (x_1..x_j, N, K)
    pm = np.prod(c[:, :j], axis=1)
    m = float(np.prod(node.domain[:j])) / pm
    pn, pk = c[:, j], c[:, j + 1]
    return gemm(1.0, m, node.domain[j] / pn, node.domain[j + 1] / pk, pm, pn, pk, node.w, r)


def einsum_cost(node: PaseNode, c, r):
    (i1, i2), out = node.attrs["eq"].split("->")[0].split(","), node.attrs["eq"].split("->")[1]
    letters = node.attrs["letters"]
    q = _q(node, c)

    def idx(pred):
        return [i for i, ch in enumerate(letters) if pred(ch)]

    batch = idx(lambda ch: ch in i1 and ch in i2 and ch in out)
    red = idx(lambda ch: ch in i1 and ch in i2 and ch not in out)
    ms = idx(lambda ch: ch in i1 and ch not in i2)
    ns = idx(lambda ch: ch in i2 and ch not in i1)

    def prod(a, cols):
        return np.prod(a[:, cols], axis=1) if cols else np.ones(len(a))

    return gemm(prod(q, batch), prod(q, ms), prod(q, ns), prod(q, red),
                prod(c, ms), prod(c, ns), prod(c, red), node.w, r)


def lstm_cost(node: PaseNode, c, r):
    lay, seq, bsz, units, _ = node.domain  # (layers, seq, batch, n, k)
    cl, cs, cb, cn, ck = (c[:, i] for i in range(5))
    cells = gemm(lay / cl, seq * bsz / (cs * cb), 4 * units / cn, 2 * units / ck,
                 cs * cb, cn, ck, node.w, r)
    need = (bsz / cb) * (units / ck)
    inter = np.where(cb * ck > cb * cn, 0.0, (bsz / cb) * np.minimum(units / cn, units / ck))
    return cells + lay * seq * r * np.maximum(0.0, need - inter)


def pool_cost(node: PaseNode, c, r):
    a = node.attrs
    q = _q(node, c)
    hh, ww = a["H"] / c[:, 2], a["W"] / c[:, 3]
    halo = ((hh + np.where(c[:, 2] > 1, a["R"], 0)) * (ww + np.where(c[:, 3] > 1, a["S"], 0))
            - hh * ww)
    return np.prod(q, axis=1) + r * q[:, 0] * q[:, 1] * halo


def norm_cost(node: PaseNode, c, r):
    ax = node.attrs["axis"]
    qq = np.prod(_q(node, c), axis=1)
    qa = node.domain[ax] / c[:, ax]
    others = np.prod(np.delete(c, ax, axis=1), axis=1)
    return 16.0 * qq + 4.0 * all_reduce(qq / qa, c[:, ax], r) + 4.0 * all_reduce(qa, others, r)


def elementwise_cost(node: PaseNode, c, r):
    return (1.0 + node.w) * np.prod(_q(node, c), axis=1)


def softmax_cost(node: PaseNode, c, r):
    ax = node.attrs["axis"]
    q = _q(node, c)
    qq = np.prod(q, axis=1)
    e = qq / q[:, ax]
    da = node.domain[ax]
    return (4.0 * qq + qq * da + all_reduce(e, c[:, ax], r) + all_reduce(e * da, c[:, ax], r)
            + all_reduce(e, c[:, ax], r))


def softmax_ce_cost(node: PaseNode, c, r):
    q = _q(node, c)
    e = np.prod(q[:, :-1], axis=1)
    return 4.0 * np.prod(q, axis=1) + 2.0 * e + np.where(c[:, -1] > 1, 2.0 * r * e, 0.0)


def reduce_mean_cost(node: PaseNode, c, r):
    qq = np.prod(_q(node, c), axis=1)
    return all_reduce(qq, np.prod(c[:, list(node.attrs["axes"])], axis=1), r)


def free(node: PaseNode, c, r):
    return np.zeros(len(c))


LAYER_COST: dict[str, Callable] = {
    "Conv": conv_cost, "FC": fc_cost, "Einsum": einsum_cost, "Embedding": einsum_cost,
    "LSTM": lstm_cost, "Pool": pool_cost, "Norm": norm_cost, "Elementwise": elementwise_cost,
    "Softmax": softmax_cost, "SoftmaxCrossEntropy": softmax_ce_cost,
    "ReduceMean": reduce_mean_cost, "Concat": free, "Ravel": free, "Unravel": free,
    "Stack": free, "Unstack": free,
}


def layer_cost(node: PaseNode, c: np.ndarray, r: float) -> np.ndarray:
    """L(c) for every row of ``c`` (configs in D order)."""
    return LAYER_COST[node.op](node, np.asarray(c, dtype=np.float64), r)


def tensor_config(m, c: np.ndarray) -> np.ndarray:
    """The tensor configurations a tensor map gives for every row of c: shape (n, len(m))."""
    c = np.asarray(c, dtype=np.float64)
    cols = [np.prod(c[:, list(e)], axis=1) if e else np.ones(len(c)) for e in m]
    return np.stack(cols, axis=1) if cols else np.ones((len(c), 0))


def edge_cost(shape, s: np.ndarray, t: np.ndarray, r: float) -> np.ndarray:
    """EDGE(T, s, t) (§2) for every producer row of s and consumer row of t: (len(s), len(t))."""
    tt = np.asarray(shape, dtype=np.float64)
    a, e = tt / s, tt / t
    need = np.prod(e, axis=1)
    inter = np.prod(np.minimum(a[:, None, :], e[None, :, :]), axis=2)
    more = np.prod(t, axis=1)[None, :] > np.prod(s, axis=1)[:, None]
    inter = np.where(more, 0.0, inter)
    return 2.0 * r * np.maximum(0.0, need[None, :] - inter)
