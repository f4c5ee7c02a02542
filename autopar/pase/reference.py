"""PaSE's four benchmark graphs built by hand from docs/pase.md §7, not from a trace.

They are the independent side of a cross-check: ``pase_view(trace(zoo model))`` must equal these
node for node (op, domain, tensor maps, w, edges). Sizes are parameters so tests can shrink them.
"""

from __future__ import annotations

from autopar.pase.graph import PaseBuilder, PaseGraph, PaseTensor


def alexnet_graph(batch: int = 128, classes: int = 1024) -> PaseGraph:
    g = PaseBuilder("alexnet")
    x = g.input((batch, 3, 227, 227))
    x = g.conv(x, 96, 11, stride=4, w=1)
    x = g.pool(x, 3, stride=2)
    x = g.conv(x, 256, 5, pad=2, w=1)
    x = g.pool(x, 3, stride=2)
    x = g.conv(x, 384, 3, pad=1, w=1)
    x = g.conv(x, 384, 3, pad=1, w=1)
    x = g.conv(x, 256, 3, pad=1, w=1)
    x = g.pool(x, 3, stride=2)
    x = g.reshape(x, (batch, 256 * 6 * 6))
    x = g.fc(x, 4096, w=1)
    x = g.fc(x, 4096, w=1)
    x = g.fc(x, classes)
    g.softmax_ce(x)
    return g.graph()


def rnnlm_graph(batch: int = 64, seq: int = 256, vocab: int = 100000, units: int = 2048,
                layers: int = 2) -> PaseGraph:
    g = PaseBuilder("rnnlm")
    x = g.embedding((batch, seq), vocab, units)
    x = g.lstm(x, layers)
    x = g.fc(x, vocab)
    g.softmax_ce(x)
    return g.graph()


def _bc(g: PaseBuilder, x: PaseTensor, n: int, kernel, stride=1, pad=0) -> PaseTensor:
    return g.norm(g.conv(x, n, kernel, stride, pad), 0)


def _inception_a(g, x, pool_features):
    b1 = _bc(g, x, 64, 1)
    b2 = _bc(g, _bc(g, x, 48, 1), 64, 5, pad=2)
    b3 = _bc(g, _bc(g, _bc(g, x, 64, 1), 96, 3, pad=1), 96, 3, pad=1)
    b4 = _bc(g, g.pool(x, 3, stride=1, pad=1, kind="avg"), pool_features, 1)
    return g.concat([b1, b2, b3, b4], 1)


def _inception_b(g, x):
    b1 = _bc(g, x, 384, 3, stride=2)
    b2 = _bc(g, _bc(g, _bc(g, x, 64, 1), 96, 3, pad=1), 96, 3, stride=2)
    b3 = g.pool(x, 3, stride=2)
    return g.concat([b1, b2, b3], 1)


def _inception_c(g, x, c7):
    b1 = _bc(g, x, 192, 1)
    t = _bc(g, _bc(g, x, c7, 1), c7, (1, 7), pad=(0, 3))
    b2 = _bc(g, t, 192, (7, 1), pad=(3, 0))
    t = _bc(g, _bc(g, x, c7, 1), c7, (7, 1), pad=(3, 0))
    t = _bc(g, _bc(g, t, c7, (1, 7), pad=(0, 3)), c7, (7, 1), pad=(3, 0))
    b3 = _bc(g, t, 192, (1, 7), pad=(0, 3))
    b4 = _bc(g, g.pool(x, 3, stride=1, pad=1, kind="avg"), 192, 1)
    return g.concat([b1, b2, b3, b4], 1)


def _inception_d(g, x):
    b1 = _bc(g, _bc(g, x, 192, 1), 320, 3, stride=2)
    t = _bc(g, _bc(g, x, 192, 1), 192, (1, 7), pad=(0, 3))
    b2 = _bc(g, _bc(g, t, 192, (7, 1), pad=(3, 0)), 192, 3, stride=2)
    b3 = g.pool(x, 3, stride=2)
    return g.concat([b1, b2, b3], 1)


def _inception_e(g, x):
    b1 = _bc(g, x, 320, 1)
    t = _bc(g, x, 384, 1)
    b2 = g.concat([_bc(g, t, 384, (1, 3), pad=(0, 1)), _bc(g, t, 384, (3, 1), pad=(1, 0))], 1)
    t = _bc(g, _bc(g, x, 448, 1), 384, 3, pad=1)
    b3 = g.concat([_bc(g, t, 384, (1, 3), pad=(0, 1)), _bc(g, t, 384, (3, 1), pad=(1, 0))], 1)
    b4 = _bc(g, g.pool(x, 3, stride=1, pad=1, kind="avg"), 192, 1)
    return g.concat([b1, b2, b3, b4], 1)


def inception3_graph(batch: int = 128, classes: int = 1000, image: int = 299) -> PaseGraph:
    g = PaseBuilder("inception3")
    x = g.input((batch, 3, image, image))
    x = _bc(g, x, 32, 3, stride=2)
    x = _bc(g, x, 32, 3)
    x = _bc(g, x, 64, 3, pad=1)
    x = g.pool(x, 3, stride=2)
    x = _bc(g, x, 80, 1)
    x = _bc(g, x, 192, 3)
    x = g.pool(x, 3, stride=2)
    for pf in (32, 64, 64):
        x = _inception_a(g, x, pf)
    x = _inception_b(g, x)
    for c7 in (128, 160, 160, 192):
        x = _inception_c(g, x, c7)
    x = _inception_d(g, x)
    x = _inception_e(g, x)
    x = _inception_e(g, x)
    x = g.reduce_mean(x, (2, 3))
    x = g.fc(x, classes)
    g.softmax_ce(x)
    return g.graph()


def _mha(g: PaseBuilder, xs: list[PaseTensor], heads: int, dk: int) -> PaseTensor:
    if len(xs) == 1:
        qkv = g.einsum("ble,shek->sbhlk", xs[0], g.input((3, heads, xs[0].shape[-1], dk)))
    else:
        st = g.stack(xs, 0)
        qkv = g.einsum("sble,shek->sbhlk", st, g.input((3, heads, xs[0].shape[-1], dk)))
    q, k, v = g.unstack(qkv, 0)
    a = g.softmax(g.einsum("bhlk,bhmk->bhlm", q, k), 3)
    o = g.einsum("bhlm,bhmk->bhlk", a, v)
    o = g.einsum("bhlk,hek->ble", o, g.input((heads, xs[0].shape[-1], dk)))
    return g.norm(g.elementwise(xs[0], o), 2)


def _ffn(g: PaseBuilder, x: PaseTensor, hidden: int) -> PaseTensor:
    e = x.shape[-1]
    h = g.einsum("ble,ef->blf", x, g.input((e, hidden)), w=2)
    y = g.einsum("blf,fe->ble", h, g.input((hidden, e)))
    return g.norm(g.elementwise(x, y), 2)


def transformer_graph(batch: int = 64, seq: int = 256, vocab: int = 50000, width: int = 512,
                      heads: int = 8, hidden: int = 2048, layers: int = 6) -> PaseGraph:
    g = PaseBuilder("transformer")
    dk = width // heads
    pos = g.input((batch, seq, width))
    x = g.elementwise(g.embedding((batch, seq), vocab, width), pos)
    for _ in range(layers):
        x = _ffn(g, _mha(g, [x], heads, dk), hidden)
    enc = x
    y = g.elementwise(g.embedding((batch, seq), vocab, width), pos)
    for _ in range(layers):
        y = _mha(g, [y], heads, dk)
        y = _ffn(g, _mha(g, [y, enc, enc], heads, dk), hidden)
    logits = g.einsum("ble,ev->blv", y, g.input((width, vocab)))
    g.softmax_ce(logits)
    return g.graph()


REFERENCE_GRAPHS = {
    "alexnet": alexnet_graph, "inception3": inception3_graph, "rnnlm": rnnlm_graph,
    "transformer": transformer_graph,
}
