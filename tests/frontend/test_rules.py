"""Iteration spaces worked out by hand for one call of each op family, traced end to end."""

import operator

import torch
import torch.nn as nn
import torch.nn.functional as F

import autopar
from autopar.frontend.rules import build_node
from autopar.core.backward import GRAD_FREE_INPUTS, NO_BACKWARD
from autopar.frontend.rules.base import Call, Tensor


class Fn(nn.Module):
    """Wraps a lambda so one op can be traced alone; ``mods`` become its submodules."""

    def __init__(self, fn, **mods):
        super().__init__()
        self.fn = fn
        for k, v in mods.items():
            setattr(self, k, v)

    def forward(self, x, y=None):
        return self.fn(self, x) if y is None else self.fn(self, x, y)


def only(graph, op):
    nodes = [n for n in graph.nodes if n.op == op]
    assert len(nodes) == 1, [(n.name, n.op) for n in graph.nodes]
    return nodes[0]


def _own(attrs: dict) -> dict:
    """A node's attributes from its rule (the trace adds whether autograd runs its backward and
    which inputs take no gradient)."""
    return {k: v for k, v in attrs.items() if k not in (NO_BACKWARD, GRAD_FREE_INPUTS)}


def dims(node):
    return {d.name: (d.size, d.reduction, d.splittable) for d in node.dims}


def test_linear_leading_axes_then_n_and_k():
    g = autopar.trace(Fn(lambda m, x: m.fc(x), fc=nn.Linear(16, 8)), (torch.randn(4, 5, 16),))
    n = only(g, "linear")
    assert dims(n) == {"b": (4, False, True), "s": (5, False, True), "n": (8, False, True), "k": (16, True, True)}
    assert n.flops == 2 * 4 * 5 * 8 * 16
    assert [(p.source, p.spec.axes) for p in n.params] == [("param:fc.weight", (("n",), ("k",))),
                                                           ("param:fc.bias", (("n",),))]
    assert n.module == "fc" and n.target == "torch.nn.Linear"


def test_conv2d_groups_stride_padding():
    conv = nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=2)
    g = autopar.trace(Fn(lambda m, x: m.c(x), c=conv), (torch.randn(2, 4, 9, 9),))
    n = only(g, "conv2d")
    assert dims(n) == {"b": (2, False, True), "g": (2, False, True), "c_out": (4, False, True),
                       "h": (5, False, False), "w": (5, False, False), "c_in": (2, True, True),
                       "kh": (3, True, False), "kw": (3, True, False)}
    assert n.inputs[0].spec.axes == (("b",), ("g", "c_in"), (), ())
    assert n.params[0].spec.axes == (("g", "c_out"), ("c_in",), ("kh",), ("kw",))
    assert n.outputs[0].axes == (("b",), ("g", "c_out"), ("h",), ("w",))
    assert n.attrs["stride"] == (2, 2) and n.attrs["padding"] == (1, 1) and n.attrs["groups"] == 2
    assert n.flops == 2 * 2 * 8 * 25 * 2 * 9


def test_conv1d_functional():
    m = Fn(lambda m, x: F.conv1d(x, m.w, stride=2))
    m.w = nn.Parameter(torch.randn(6, 3, 5))
    g = autopar.trace(m, (torch.randn(2, 3, 20),))
    n = only(g, "conv1d")
    assert dims(n)["l"] == (8, False, False) and dims(n)["k"] == (5, True, False)
    assert n.params[0].source == "param:w"


def test_matmul_broadcasts_batch_axes():
    g = autopar.trace(Fn(lambda m, a, b: a @ b), (torch.randn(2, 3, 4, 5), torch.randn(5, 6)))
    n = only(g, "matmul")
    assert dims(n) == {"b": (2, False, True), "b1": (3, False, True), "m": (4, False, True), "n": (6, False, True),
                       "k": (5, True, True)}
    assert n.inputs[1].spec.axes == (("k",), ("n",))
    assert n.flops == 2 * 2 * 3 * 4 * 6 * 5


def test_einsum_letters_are_dims():
    g = autopar.trace(Fn(lambda m, a, b: torch.einsum("bij,bjk->bik", a, b)), (torch.randn(2, 3, 4), torch.randn(2, 4, 5)))
    n = only(g, "einsum")
    assert dims(n) == {"b": (2, False, True), "i": (3, False, True), "j": (4, True, True), "k": (5, False, True)}
    assert n.flops == 2 * 2 * 3 * 4 * 5


def test_embedding_vocab_is_a_reduction():
    g = autopar.trace(Fn(lambda m, i: m.e(i), e=nn.Embedding(100, 16)), (torch.randint(0, 100, (4, 7)),))
    n = only(g, "embedding")
    assert dims(n) == {"b": (4, False, True), "s": (7, False, True), "d": (16, False, True), "v": (100, True, True)}
    assert n.flops == 0 and n.bytes_written == 4 * 7 * 16 * 4


def test_norms_and_softmax_keep_their_normalized_axis_whole():
    mods = {"ln": nn.LayerNorm(16), "bn": nn.BatchNorm2d(3)}
    g = autopar.trace(Fn(lambda m, x, y: (F.softmax(m.ln(x), dim=1), m.bn(y)), **mods),
                      (torch.randn(2, 5, 16), torch.randn(2, 3, 4, 4)))
    assert dims(only(g, "layer_norm")) == {"b": (2, False, True), "s": (5, False, True), "n": (16, False, False)}
    sm = only(g, "softmax")
    assert [d.splittable for d in sm.dims] == [True, False, True] and sm.attrs["axis"] == 1
    bn = only(g, "batch_norm")
    assert dims(bn) == {"b": (2, False, True), "c": (3, False, True), "h": (4, False, False), "w": (4, False, False)}
    assert {p.source for p in bn.params} == {"param:bn.weight", "param:bn.bias", "param:bn.running_mean",
                                              "param:bn.running_var"}
    assert bn.attrs["training"] is True and bn.attrs["eps"] == 1e-5


def test_sdpa_space_and_flops():
    q = torch.randn(2, 4, 16, 8)
    g = autopar.trace(Fn(lambda m, q: F.scaled_dot_product_attention(q, q, q, is_causal=True)), (q,))
    n = only(g, "sdpa")
    assert dims(n) == {"b": (2, False, True), "h": (4, False, True), "l": (16, False, True), "m": (16, True, False),
                       "e": (8, True, False), "v": (8, False, True)}
    assert n.flops == 2 * 2 * 4 * 16 * 16 * 8 * 2 and n.attrs["is_causal"] is True


def test_elementwise_broadcast_and_scalars():
    g = autopar.trace(Fn(lambda m, a, b: (a + b) * 2.0), (torch.randn(8, 1, 16), torch.randn(5, 16)))
    add = [n for n in g.nodes if n.attrs.get("fn") == "add"][0]
    assert add.outputs[0].shape == (8, 5, 16)
    assert add.inputs[0].spec.axes == (("d0",), (), ("d2",))  # the size-1 axis is broadcast
    assert add.inputs[1].spec.axes == (("d1",), ("d2",))
    mul = [n for n in g.nodes if n.attrs.get("fn") == "mul"][0]
    assert mul.attrs["scalar"] == 2.0 and len(mul.inputs) == 1


def test_reduce_view_permute():
    g = autopar.trace(Fn(lambda m, x: x.view(2, 3, 4, 3).permute(0, 2, 1, 3).sum(dim=-1, keepdim=True)),
                      (torch.randn(2, 3, 12),))
    view, perm, red = only(g, "view"), only(g, "permute"), only(g, "reduce")
    assert view.inputs[0].spec.axes == (("d0",), ("d1",), ("d2", "d3"))  # the split axis is merged
    assert view.attrs["shape"] == (2, 3, 4, 3) and view.bytes_read == 0
    assert perm.attrs["perm"] == (0, 2, 1, 3)
    assert perm.outputs[0].axes == (("d0",), ("d2",), ("d1",), ("d3",))
    assert _own(red.attrs) == {"fn": "sum", "axes": (3,), "keepdim": True}
    assert red.dims[3].reduction and red.outputs[0].axes[3] == ()


def test_split_outputs_are_one_node_and_getitem_is_an_operand():
    def f(m, x):
        a, b, c = x.split(4, dim=1)
        return a + c
    g = autopar.trace(Fn(f), (torch.randn(2, 12),))
    sp = only(g, "split")
    assert _own(sp.attrs) == {"axis": 1, "sizes": (4, 4, 4), "squeeze": False} and len(sp.outputs) == 3
    assert not sp.dim("d1").splittable
    add = only(g, "elementwise")
    assert [(o.source, o.output) for o in add.inputs] == [(sp.name, 0), (sp.name, 2)]
    assert not any(n.target == "operator.getitem" for n in g.nodes)


def test_cat_chunk_and_slice_of_a_parameter():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = nn.Embedding(10, 4)

        def forward(self, x):
            s = x.shape[1]
            a, b = torch.chunk(x + self.pos.weight[:s], 2, dim=2)
            return torch.cat([b, a], dim=-1)[:, 1:]

    g = autopar.trace(M(), (torch.randn(3, 6, 4),))
    sl = [n for n in g.nodes if n.op == "slice"]
    assert sl[0].params[0].source == "param:pos.weight" and sl[0].outputs[0].shape == (6, 4)
    assert sl[0].params[0].spec.axes == ((), ("d1",))  # 6 of 10 rows: the input axis is not a shard
    assert sl[1].inputs[0].spec.axes == (("d0",), (), ("d2",)) and sl[1].outputs[0].shape == (3, 5, 4)
    assert only(g, "cat").attrs["axis"] == 2
    assert only(g, "split").attrs["sizes"] == (2, 2)
    assert not any(n.op == "opaque" for n in g.nodes)  # x.shape[1] became a constant, not a node


def test_pooling_plain_and_adaptive():
    mods = {"p": nn.MaxPool2d(2), "a": nn.AdaptiveAvgPool2d((1, 1))}
    g = autopar.trace(Fn(lambda m, x: m.a(m.p(x)) + F.avg_pool2d(x, 3, stride=1, padding=1).mean(), **mods),
                      (torch.randn(2, 3, 8, 8),))
    pools = [n for n in g.nodes if n.op == "pool"]
    assert [(n.attrs["kind"], n.attrs["adaptive"]) for n in pools] == [("max", False), ("avg", True), ("avg", False)]
    assert pools[0].attrs["kernel"] == (2, 2) and pools[0].attrs["stride"] == (2, 2)
    assert pools[1].attrs["output_size"] == (1, 1)
    assert dims(pools[0]) == {"b": (2, False, True), "c": (3, False, True), "h": (4, False, False),
                              "w": (4, False, False)}


def test_lstm_is_one_node():
    g = autopar.trace(Fn(lambda m, x: m.l(x)[0], l=nn.LSTM(8, 16, num_layers=3, batch_first=True)),
                      (torch.randn(2, 5, 8),))
    n = only(g, "lstm")
    assert len(g.nodes) == 1 and len(n.params) == 12
    assert dims(n) == {"b": (2, False, True), "t": (5, False, False), "l": (3, False, False), "g": (4, False, False),
                       "h": (16, False, True)}
    assert n.attrs["layers"] == 3 and n.attrs["batch_first"] is True
    assert n.flops == 2 * 2 * 5 * 4 * 16 * ((8 + 16) + 2 * (16 + 16))
    assert g.outputs == [(n.name, 0)]


def test_cross_entropy_and_dropout():
    g = autopar.trace(Fn(lambda m, x, y: F.cross_entropy(m.d(x), y), d=nn.Dropout(0.25)),
                      (torch.randn(6, 10), torch.randint(0, 10, (6,))))
    ce, do = only(g, "cross_entropy"), only(g, "dropout")
    assert dims(ce) == {"b": (6, True, True), "c": (10, False, False)}
    assert ce.attrs["reduction"] == "mean" and ce.outputs[0].shape == ()
    assert do.attrs["p"] == 0.25


def test_unknown_op_is_opaque_and_listed():
    g = autopar.trace(Fn(lambda m, x: torch.flip(x, [0]).relu()), (torch.randn(4, 4),))
    bad = g.unsupported
    assert [n.op for n in bad] == ["opaque"] and "flip" in bad[0].unsupported
    assert bad[0].outputs[0].axes == ((), ())
    assert only(g, "elementwise").inputs[0].source == bad[0].name


def test_a_rule_that_cannot_bind_its_arguments_becomes_opaque_not_a_crash():
    x = Tensor((2, 3), "float32", "input:x")
    call = Call("linear", "torch.nn.functional.linear", {"input": x, "weight": "not a tensor"},
                (Tensor((2, 3), "float32"),))
    node = build_node("n", "", call)
    assert node.op == "opaque" and "linear" in node.unsupported


def test_getitem_on_a_tuple_result_picks_an_output():
    call = Call("split", "Tensor.split", {"input": Tensor((4, 6), "float32", "input:x"), "dim": 1},
                (Tensor((4, 2), "float32"), Tensor((4, 4), "float32")))
    node = build_node("sp", "m", call)
    assert node.attrs["sizes"] == (2, 4) and [o.axes for o in node.outputs] == [(("d0",), ())] * 2
    assert operator.getitem  # the fx side of this is covered by the split test above
