"""Planning the six Hugging Face families: no crash, every replicated op explained, splits on offer.

The space a node offers is what the search can choose from: every linear, convolution and
attention node must offer a data split (its batch dim alone) and a tensor split (output features,
output channels or groups, heads) on a 4-device mesh, and the head split must reach the
attention through the projections' ``view(b, s, h, d)``.
"""

import pytest

import autopar
from autopar.core.batch import batch_dims
from autopar.core.space import mesh_configs
from tests.helpers import hf_models

NAMES = hf_models.NAMES


@pytest.mark.parametrize("devices", [4, 8])
@pytest.mark.parametrize("name", NAMES)
def test_plans_and_reports_every_replicated_op_with_its_reason(hf_traced, name, devices):
    model, kwargs, graph = hf_traced[name]
    plan = autopar.plan(model, kwargs, autopar.Cluster.preset("8xH100", devices=devices), graph=graph)
    dp = plan.baselines["data_parallel"]
    assert plan.cost <= dp.cost * (1 + 1e-9)  # the optimum is never worse than data parallelism
    assert plan.unsupported == {n.name: n.unsupported for n in graph.unsupported}
    report = plan.report()
    for node, why in plan.unsupported.items():
        assert f"  {node}: {why}" in report
    # what these models replicate: tensors made from sizes (arange, new_ones, rand), nothing else
    assert all("factory op" in why for why in plan.unsupported.values()), plan.unsupported


def _tensor_dim(node) -> str:
    if node.op == "sdpa":
        return "h"
    if node.op.startswith("conv"):
        return "g" if node.attrs["groups"] > 1 and node.dim("c_out").size == 1 else "c_out"
    weight = next(p for p in node.params if len(p.spec.shape) == 2)  # linear (n, k), Conv1D (k, n)
    return next(a[0] for a in weight.spec.axes if not node.dim(a[0]).reduction)


def _offers(configs, names, dim) -> bool:
    """A config that splits ``dim`` and nothing else."""
    i = names.index(dim)
    return any(c.splits[i] > 1 and all(s == 1 for j, s in enumerate(c.splits) if j != i) for c in configs)


@pytest.mark.parametrize("name", NAMES)
def test_linear_conv_and_attention_offer_data_and_tensor_splits(hf_traced, name):
    _, _, graph = hf_traced[name]
    mesh = autopar.Cluster(devices=4).mesh()
    batch = batch_dims(graph)
    heavy = [n for n in graph.nodes if n.flops and n.op in ("linear", "matmul", "conv1d", "conv2d", "sdpa")]
    assert heavy and sum(n.flops for n in heavy) == graph.flops  # every FLOP sits in one of them
    for node in heavy:
        names = [d.name for d in node.dims]
        configs = mesh_configs(node, mesh)
        assert batch[node.name] is not None and _offers(configs, names, batch[node.name]), node.name
        assert _offers(configs, names, _tensor_dim(node)), node.name


def _head_views(graph):
    """``view(b, s, h*d) -> (b, s, h, d)`` nodes and the dim that indexes h."""
    for node in graph.nodes:
        x, out = node.inputs[0].spec if node.inputs else None, node.outputs[0]
        if node.op == "view" and x is not None and len(x.shape) == 3 and len(out.shape) == 4 and \
                x.shape[:2] == out.shape[:2] and min(out.shape[2:]) > 1:
            yield node, out.axes[2][0]


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama", "vit"])
def test_heads_stay_splittable_through_view_and_transpose(hf_traced, name):
    _, _, graph = hf_traced[name]
    views = list(_head_views(graph))
    assert len(views) >= 6  # q, k and v of two layers
    for node, h in views:
        assert node.dim(h).splittable and node.inputs[0].spec.axes[2][0] == h, node.name  # h major in h*d
    for node in graph.nodes:
        if node.op == "sdpa":
            assert node.dim("h").splittable and node.dim("l").splittable and node.dim("b").splittable


@pytest.mark.parametrize("name", ["bert", "vit"])
def test_the_expert_plan_splits_heads_end_to_end(hf_traced, name):
    """Megatron pins the projections column-parallel; the heads then flow to attention with no reshard."""
    model, kwargs, graph = hf_traced[name]
    plan = autopar.plan(model, kwargs, autopar.Cluster.preset("8xH100", devices=4), graph=graph)
    expert = plan.baselines["expert"]
    for node in graph.nodes:
        if node.op == "sdpa":
            config = expert.assignment[node.name]
            assert config.splits[[d.name for d in node.dims].index("h")] == 4, node.name


def test_gpt2_and_llama_get_the_expert_baseline(hf_traced):
    """GPT-2's projections are addmm (Conv1D) and Llama's norm is RMSNorm: both still transformers."""
    for name in ("gpt2", "llama"):
        model, kwargs, graph = hf_traced[name]
        plan = autopar.plan(model, kwargs, autopar.Cluster.preset("8xH100", devices=4), graph=graph)
        assert "expert" in plan.baselines, name
