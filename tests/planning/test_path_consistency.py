"""One strategy, two planning paths: the flat exact search's tables and the hierarchical search's
step price must price the same plan the same, term by term (``tests/helpers/both_paths.py``),
since ``autopar.plan`` takes the faster of the two where memory binds.

The expected figures are counted by hand from the model's parameters (the gpt of the zoo, 2
layers: 536064 parameter elements, 8192 of them the position table's, which a node without a
batch dim slices; its gradient is whole on every data-parallel rank, so ``codegen/zero.py``
neither syncs nor slices it), not read from either path.

Deliberate differences, asserted as such: the recomputed block's activations rebuilt during its
backward, which the hierarchical price holds on top of the step's peak and the flat tables (a sum
over nodes) do not (the flat plan says so in its notes, ``planning/options.NOTE``).

Not yet shared, so not asserted here (``docs/architecture.md``): the data-parallel sync (the flat
tables charge each node its share of a bucket's latency, none hidden; the hierarchical price one
latency per collective, the part ``planning/overlap.py`` leaves exposed), the loss's all-reduces
over the data-parallel ranks (charged by the flat tables only) and an embedding's roofline bytes
on a batch shard.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import autopar
from autopar.core.blocks import apply_training
from autopar.core.strategy import TrainingOptions
from autopar.core.tables import Config
from autopar.cost_models.analytic import AnalyticModel
from tests.helpers.both_paths import PRECISION, flat_terms, hierarchical, hierarchical_terms

ELEMENTS = 536064  # the model's parameter elements: sum(p.numel() for p in model.parameters())
WHOLE = 64 * 128  # pos.weight: read by a node without a batch dim
DEVICES = 4
# bytes a fused mixed-precision Adam moves per stepped element (``training.optimizer_step_time``):
# the bf16 gradient read (2), both fp32 moments read and written (2 x 2 x 4), the fp32 master
# weight read and written (2 x 4), the bf16 compute copy read and written (2 x 2)
FUSED_ADAM_BYTES = 2 + 2 * 2 * 4 + 2 * 4 + 2 * 2

# (tensor, data, zero, recompute)
DATA_PARALLEL = [(1, 4, 0, False), (1, 4, 1, False), (1, 4, 2, False), (1, 4, 1, True)]
CASES = DATA_PARALLEL + [(2, 2, 1, False)]


@pytest.fixture(scope="module")
def priced():
    model, inputs = autopar.zoo.get("gpt", layers=2)
    assert sum(p.numel() for p in model.parameters()) == ELEMENTS
    assert model.pos.weight.numel() == WHOLE
    cluster = autopar.Cluster.preset("a100", devices=DEVICES)
    out = {}

    def get(case):
        if case not in out:
            t, d, z, r = case
            plan = hierarchical(model, inputs, cluster, t, d, z, r, batch=inputs[0].shape[0])
            out[case] = (hierarchical_terms(plan), flat_terms(plan, cluster, z, r), cluster)
        return out[case]

    return get


def stepped(zero: int) -> float:
    """Elements one data-parallel device steps: ZeRO >= 1 slices what is synced over the data group."""
    return ELEMENTS if zero == 0 else (ELEMENTS - WHOLE) / DEVICES + WHOLE


@pytest.mark.parametrize("case", DATA_PARALLEL, ids=str)
def test_the_optimizer_step_is_priced_alike_on_both_paths(priced, case):
    hier, flat, cluster = priced(case)
    expected = stepped(case[2]) * FUSED_ADAM_BYTES / (cluster.memory_bandwidth * 0.8)
    assert hier.time["optimizer step"] == pytest.approx(expected, rel=1e-9)
    assert flat.time["optimizer"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("case", DATA_PARALLEL, ids=str)
def test_parameter_state_is_counted_alike_on_both_paths(priced, case):
    hier, flat, _ = priced(case)
    zero = case[2]
    sliced = (ELEMENTS - WHOLE) / DEVICES + WHOLE
    params = 2 * ELEMENTS  # bf16 compute copy
    grads = 2 * (sliced if zero >= 2 else ELEMENTS)
    optimizer = (8 + 4) * (sliced if zero >= 1 else ELEMENTS)  # Adam's two fp32 moments + fp32 master
    assert hier.memory_terms["parameters"] == pytest.approx(params) == flat.memory_terms["params"]
    assert hier.memory_terms["gradients"] == pytest.approx(grads) == flat.memory_terms["grads"]
    assert (hier.memory_terms["optimizer state + master weights"] == pytest.approx(optimizer)
            == flat.memory_terms["optimizer"])


@pytest.mark.parametrize("case", CASES, ids=str)
def test_peak_memory_agrees_but_for_the_recomputed_block(priced, case):
    hier, flat, _ = priced(case)
    rebuilt = hier.memory_terms.get("transient (recomputed block, gathered ZeRO-3 parameters)", 0.0)
    assert rebuilt > 0 if case[3] else rebuilt == 0
    # one function per state (exact); the tensor group's layout within 2% (its DP's choices)
    assert hier.memory == pytest.approx(flat.memory + rebuilt, rel=0.02 if case[0] > 1 else 1e-9)


def test_tensor_times_data_prices_the_optimizer_step_and_state_alike(priced):
    hier, flat, _ = priced((2, 2, 1, False))
    assert hier.time["optimizer step"] == pytest.approx(flat.time["optimizer"], rel=0.02)
    for h, f in (("parameters", "params"), ("gradients", "grads"), ("optimizer state + master weights", "optimizer")):
        assert hier.memory_terms[h] == pytest.approx(flat.memory_terms[f], rel=0.02)


@pytest.mark.parametrize("case", DATA_PARALLEL, ids=str)
def test_compute_is_priced_alike_on_both_paths(priced, case):
    """Forward, backward and recomputed forward of every node: the flat tables price a node on
    its batch shard, the hierarchical search the same node on a microbatch of ``batch / data``."""
    hier, flat, _ = priced(case)
    assert hier.time["compute"] == pytest.approx(flat.time["compute"], rel=1e-9)


def test_an_embedding_on_a_batch_shard_moves_its_rows_not_the_table():
    """A lookup does no FLOPs (torch's counter), so the roofline prices its bytes: on a batch
    shard, the shard's indices, the rows they gather (one per index) and its output, each 1/d of
    the batch's; the table itself, replicated, is not read whole."""
    model, inputs = autopar.zoo.get("gpt", layers=2)
    with FlopCounterMode(display=False) as counter:
        model.tok(inputs[0])
    assert counter.get_total_flops() == 0
    cluster = autopar.Cluster.preset("a100", devices=DEVICES)
    node = apply_training(autopar.trace(model, inputs), TrainingOptions(0, PRECISION, False)).node("tok")
    axes = tuple(range(len(cluster.mesh().shape)))
    shard = Config((DEVICES,) + (1,) * (len(node.dims) - 1), (axes,) + ((),) * (len(node.dims) - 1))
    tokens = inputs[0].numel() / DEVICES
    width, item = model.tok.weight.shape[1], torch.tensor([], dtype=torch.bfloat16).element_size()
    local = tokens * (inputs[0].element_size() + 2 * width * item)  # indices, gathered rows, output
    fwd = next(t.seconds for t in AnalyticModel().node_breakdown(node, shard, cluster).terms
               if t.label == "compute forward")
    assert fwd == pytest.approx(local / (cluster.memory_bandwidth * 0.8), rel=1e-9)
