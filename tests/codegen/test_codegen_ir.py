"""Placement derivation from the IR, on a hand-built IR of the zoo MLP.

``mlp_graph`` (tests/helpers/mlp.py) is a stand-in for ``autopar.trace`` (linear, elementwise,
cross_entropy only) so that codegen can be tested before and independently of the tracer.
"""

from __future__ import annotations

import pytest
from torch.distributed.tensor import Partial, Replicate, Shard

import autopar
from autopar.core.ir import Dim, Node, Operand, TensorSpec
from autopar.core.tables import Config
from autopar.codegen.placements import LayoutError, StridedCut, local_shape, node_layout
from tests.helpers.mlp import linear_cfg, mlp_graph


@pytest.fixture(scope="module")
def mlp():
    model, inputs = autopar.zoo.get("mlp", batch=8, inputs=8, hidden=16, classes=4)
    return model, inputs, mlp_graph(model, inputs)


def test_fixture_matches_the_model(mlp):
    _, _, g = mlp
    assert [n.op for n in g.nodes] == ["linear", "elementwise", "linear", "elementwise", "linear",
                                      "cross_entropy"]
    assert g.node("layers_0").params[0].source == "param:layers.0.weight"


def test_column_parallel_linear_shards_weight_rows_and_output_columns(mlp):
    lay = node_layout(mlp[2].node("layers_0"), linear_cfg(n=(0,)), (2,))
    assert lay.inputs == ((Replicate(),),)
    assert lay.params == ((Shard(0),), (Shard(0),))
    assert lay.outputs == ((Shard(1),),)
    # every rank reads all of x for its own columns: x's gradient is a partial sum
    assert lay.input_grads == ((Partial(),),)
    assert lay.param_grads == lay.params


def test_row_parallel_linear_leaves_partial_sums(mlp):
    lay = node_layout(mlp[2].node("layers_1"), linear_cfg(k=(0,)), (2,))
    assert lay.inputs == ((Shard(1),),)
    assert lay.outputs == ((Partial(),),)
    # the bias is outside the sum: replicated, added by coordinate 0 only, gradient summed
    assert lay.params == ((Shard(1),), (Replicate(),))
    assert lay.param_additive == ((), (0,))
    assert lay.param_grads[1] == (Partial(),)


def test_data_parallel_on_two_axes_and_mixed(mlp):
    lay = node_layout(mlp[2].node("layers_0"), linear_cfg(b=(0, 1)), (2, 2))
    assert lay.inputs == ((Shard(0), Shard(0)),)
    assert lay.params[0] == (Replicate(), Replicate())
    assert lay.param_grads[0] == (Partial(), Partial())  # the data-parallel all-reduce
    lay = node_layout(mlp[2].node("layers_0"), linear_cfg(b=(0,), k=(1,)), (2, 2))
    assert lay.outputs == ((Shard(0), Partial()),)
    assert lay.inputs == ((Shard(0), Shard(1)),)
    assert lay.split_counts == {"b": 2, "n": 1, "k": 2}
    assert local_shape(mlp[2].node("layers_0").inputs[0].spec, lay.split_counts) == (4, 4)


def test_unassigned_mesh_axes_replicate_without_partial_grads(mlp):
    lay = node_layout(mlp[2].node("layers_0"), linear_cfg(b=(1,)), (2, 2))
    assert lay.inputs == ((Replicate(), Shard(0)),)
    assert lay.param_grads[0] == (Replicate(), Partial())


def test_bad_configs_are_refused(mlp):
    node = mlp[2].node("layers_0")
    with pytest.raises(LayoutError, match="ascending"):
        node_layout(node, Config((4, 1, 1), ((1, 0), (), ())), (2, 2))
    with pytest.raises(LayoutError, match="cuts both"):
        node_layout(node, Config((2, 2, 1), ((0,), (0,), ())), (2, 2))


def test_minor_dim_of_a_merged_axis_is_a_strided_cut():
    x = TensorSpec((4, 6), "float32", (("b",), ("h", "d")))
    node = Node("v", "view", "view", "", (Dim("b", 4), Dim("h", 2), Dim("d", 3)),
                (Operand("input:x", 0, x),), (),
                (TensorSpec((4, 2, 3), "float32", (("b",), ("h",), ("d",))),))
    lay = node_layout(node, Config((1, 2, 1), ((), (0,), ())), (2,))
    assert lay.inputs == ((Shard(1),),) and lay.input_strided == ((),)
    lay = node_layout(node, Config((1, 1, 3), ((), (), (0,))), (3,))
    # the input arrives whole on that axis (its gradient: a sum), the view keeps its blocks
    assert lay.inputs == ((Replicate(),),) and lay.input_grads == ((Partial(),),)
    assert lay.input_strided == ((StridedCut(0, 1, "d"),),)
    assert lay.outputs == ((Shard(2),),) and lay.output_strided == ((),)
    assert local_shape(x, lay.split_counts) == (4, 2)


def test_merged_output_cut_on_a_minor_dim_is_partial():
    node = Node("m", "view", "view", "", (Dim("b", 4), Dim("h", 2), Dim("d", 4)),
                (Operand("input:x", 0, TensorSpec((4, 2, 4), "float32",
                                                  (("b",), ("h",), ("d",)))),), (),
                (TensorSpec((4, 8), "float32", (("b",), ("h", "d"))),))
    lay = node_layout(node, Config((2, 1, 2), ((0,), (), (1,))), (2, 2))
    assert lay.outputs == ((Shard(0), Partial()),)
    assert lay.output_strided == ((StridedCut(1, 1, "d"),),)


@pytest.mark.parametrize("name", ["mlp", "gpt", "cnn"])
def test_placements_agree_with_the_cost_models_layouts(name):
    """``autopar.core.layout`` is what the cost models price; codegen must build exactly that layout
    (a strided shard is built as Replicate-then-blocks for inputs, Partial for outputs)."""
    from autopar.core import layout as L
    from autopar.core.tables import Mesh
    from autopar.core.space import mesh_configs

    sizes = {"mlp": {}, "gpt": dict(layers=1, seq=8, width=16, vocab=32),
             "cnn": dict(blocks=1, channels=4, image=8)}[name]
    model, inputs = autopar.zoo.get(name, **sizes)
    graph = autopar.trace(model, inputs)
    mesh = Mesh((2, 2))

    def torch_placement(p, output):
        if isinstance(p, L.Shard):
            if p.period == 1:
                return Shard(p.axis)
            return Partial() if output else Replicate()
        return Partial() if isinstance(p, L.Partial) else Replicate()

    checked = 0
    for node in graph.nodes:
        for cfg in mesh_configs(node, mesh):
            ours = node_layout(node, cfg, mesh.shape)
            theirs = L.node_layouts(node, cfg, mesh)
            for mine, their, out in [(ours.inputs, theirs.inputs, False),
                                     (ours.params, theirs.params, False),
                                     (ours.outputs, theirs.outputs, True)]:
                assert mine == tuple(tuple(torch_placement(p, out) for p in t) for t in their), \
                    (node.name, cfg)
            checked += 1
    assert checked > len(graph.nodes)
