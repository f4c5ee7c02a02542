"""The zoo MLP as codegen tests use it: its IR written by hand, and named plans for it.

``mlp_graph`` is a stand-in for ``autopar.trace`` (linear, elementwise, cross_entropy only) so
that codegen can be tested before and independently of the tracer. ``plans(world)`` gives data
parallel, Megatron and a forced reduction split (partial sums flow into the next node) on 2 and 4
devices, the same plans on threads (test_codegen_mlp) and on gloo processes (test_codegen_gloo).
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.passes.shape_prop import ShapeProp

from autopar.core.ir import Dim, Graph, Node, Operand, TensorSpec
from autopar.core.tables import Config


def _spec(t, axes) -> TensorSpec:
    return TensorSpec(tuple(t.shape), str(t.dtype).removeprefix("torch."), tuple(axes))


def _shape(n: fx.Node):
    return n.meta["tensor_meta"]


def mlp_graph(model, inputs) -> Graph:
    """Trace the zoo MLP with fx and write its IR by hand: linear (b, n, k), relu (b, f), CE."""
    gm = fx.symbolic_trace(model)
    ShapeProp(gm).propagate(*inputs)
    nodes = []
    for n in gm.graph.nodes:
        if n.op == "call_module":
            mod = gm.get_submodule(n.target)
            (b, k), nout = _shape(n.args[0]).shape, mod.out_features
            x_src = f"input:{n.args[0].name}" if n.args[0].op == "placeholder" else n.args[0].name
            nodes.append(Node(
                n.name, "linear", "torch.nn.Linear", n.target,
                (Dim("b", b), Dim("n", nout), Dim("k", k, reduction=True)),
                (Operand(x_src, 0, _spec(_shape(n.args[0]), [("b",), ("k",)])),),
                (Operand(f"param:{n.target}.weight", 0, _spec(mod.weight, [("n",), ("k",)])),
                 Operand(f"param:{n.target}.bias", 0, _spec(mod.bias, [("n",)]))),
                (_spec(_shape(n), [("b",), ("n",)]),), flops=2 * b * nout * k))
        elif n.op == "call_function" and n.target is torch.nn.functional.relu:
            b, f = _shape(n).shape
            nodes.append(Node(
                n.name, "elementwise", "torch.nn.functional.relu", "", (Dim("b", b), Dim("f", f)),
                (Operand(n.args[0].name, 0, _spec(_shape(n.args[0]), [("b",), ("f",)])),), (),
                (_spec(_shape(n), [("b",), ("f",)]),), attrs={"fn": "relu"}))
        elif n.op == "call_function" and n.target is torch.nn.functional.cross_entropy:
            b, c = _shape(n.args[0]).shape
            nodes.append(Node(
                n.name, "cross_entropy", "torch.nn.functional.cross_entropy", "",
                (Dim("b", b, reduction=True), Dim("c", c, reduction=True, splittable=False)),
                (Operand(n.args[0].name, 0, _spec(_shape(n.args[0]), [("b",), ("c",)])),
                 Operand(f"input:{n.args[1].name}", 0, _spec(_shape(n.args[1]), [("b",)]))), (),
                (_spec(_shape(n), []),), attrs={"reduction": n.kwargs.get("reduction", "mean")}))
    specs = {n.name: TensorSpec(tuple(_shape(n).shape), str(_shape(n).dtype)[6:],
                                ((),) * len(_shape(n).shape))
             for n in gm.graph.nodes if n.op == "placeholder"}
    return Graph(nodes, specs, [(nodes[-1].name, 0)], "mlp", fx_graph=gm)


def linear_cfg(b=(), n=(), k=()) -> Config:
    """A linear's config from the mesh axes cutting its b, n, k dims (mesh of 2s)."""
    return Config(tuple(2 ** len(a) for a in (b, n, k)), (tuple(b), tuple(n), tuple(k)))


MLP = dict(batch=8, inputs=8, hidden=16, layers=2, classes=4)


def ew(*axes_b_f) -> Config:
    b, f = axes_b_f
    return Config((2 ** len(b), 2 ** len(f)), (tuple(b), tuple(f)))


def ce(b=()) -> Config:
    return Config((2 ** len(b), 1), (tuple(b), ()))


def plans(world: int) -> dict[str, dict[str, Config]]:
    """Named assignments for a mesh of ``world`` devices (1-d for 2, (2, 2) for 4)."""
    if world == 2:
        return {
            "data_parallel": {"layers_0": linear_cfg(b=(0,)), "relu": ew((0,), ()),
                              "layers_1": linear_cfg(b=(0,)), "relu_1": ew((0,), ()),
                              "head": linear_cfg(b=(0,)), "cross_entropy": ce((0,))},
            "megatron": {"layers_0": linear_cfg(n=(0,)), "relu": ew((), (0,)),
                         "layers_1": linear_cfg(k=(0,))},
            "reduction_split": {"layers_0": linear_cfg(k=(0,)), "relu": ew((), (0,)),
                                "layers_1": linear_cfg(k=(0,)), "head": linear_cfg(n=(0,))},
        }
    return {
        "data_parallel": {"layers_0": linear_cfg(b=(0, 1)), "relu": ew((0, 1), ()),
                          "layers_1": linear_cfg(b=(0, 1)), "relu_1": ew((0, 1), ()),
                          "head": linear_cfg(b=(0, 1)), "cross_entropy": ce((0, 1))},
        "dp_x_megatron": {"layers_0": linear_cfg(b=(0,), n=(1,)), "relu": ew((0,), (1,)),
                          "layers_1": linear_cfg(b=(0,), k=(1,)), "relu_1": ew((0,), ()),
                          "head": linear_cfg(b=(0,)), "cross_entropy": ce((0,))},
        "reduction_split": {"layers_0": linear_cfg(b=(0,), k=(1,)), "relu": ew((1,), (0,)),
                            "layers_1": linear_cfg(k=(0, 1)), "relu_1": ew((), (0, 1)),
                            "head": linear_cfg(k=(0, 1)), "cross_entropy": ce((1,))},
    }
