"""The rules' axis maps on six Hugging Face models, checked against torch by running the pieces.

For every node of each model and every dim it offers to split, the op runs on the pieces of its
operands and must give the pieces of its output (``tests/helpers/shard_check.py``): rotary embeddings,
RMSNorm, repeat_kv, masks, the fused qkv split, the class token's cat, drop-path and all.
"""

import pytest

import autopar
from tests.helpers import hf_models, shard_check


@pytest.mark.parametrize("name", hf_models.NAMES)
def test_every_offered_split_computes_the_split_output(name):
    model, kwargs = hf_models.build(name, **({"drop_path": 0.5} if name == "convnext" else {}))
    graph = autopar.trace(model, kwargs)
    values = shard_check.record(graph, (), kwargs)
    outcomes = shard_check.check_graph(graph, values)
    bad = [(o.node, o.dim, o.why) for o in outcomes if not o.ok]
    checked = [o for o in outcomes if o.ok and not o.why]
    print(f"{name}: {len(checked)} splits checked, {len(outcomes) - len(checked) - len(bad)} skipped")
    assert not bad
    assert len(checked) >= 2 * len(graph.nodes) // 3  # most nodes offer several splits


def test_the_check_catches_a_wrong_axis_map():
    """A cat whose joined axis claims to split would fail: the check can fail."""
    import dataclasses

    model, kwargs = hf_models.build("vit")
    graph = autopar.trace(model, kwargs)
    values = shard_check.record(graph, (), kwargs)
    cat = next(n for n in graph.nodes if n.op == "cat")
    axis = cat.attrs["axis"]
    joined = cat.outputs[0].axes[axis][0]
    wrong = dataclasses.replace(cat, dims=tuple(dataclasses.replace(d, splittable=True) for d in cat.dims),
                                inputs=tuple(dataclasses.replace(o, spec=dataclasses.replace(
                                    o.spec, axes=cat.outputs[0].axes)) for o in cat.inputs))
    assert not shard_check.check(graph, values, wrong, joined).ok
    assert shard_check.check(graph, values, cat, cat.outputs[0].axes[0][0]).ok
