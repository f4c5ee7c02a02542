"""ZeRO-3 per block, measured: one rank of a data-parallel ZeRO-3 plan for 8 devices (torch's
fake process group, ``autopar measure``'s CPU allocator count) holds what the plan predicts.

The model has 8 blocks whose parameters dominate its memory (wide, a short sequence), so where
the parameters are whole matters: a rank holding every block's parameters whole from the forward
to the backward's end, or a price counting only the shards, is off by far more than the 15% the
other measured plans are held to. Independent of the price: the peak stays below the shards plus
half the blocks' whole parameters and gradients, and above the root's and two blocks'. Under bf16
mixed precision the blocks are gathered (and their gradients made) in bf16, as ``fully_shard``
with ``MixedPrecisionPolicy(param_dtype=bf16)`` gathers them: half fp32's bytes whole.
"""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json, sys, torch, autopar
from autopar.cli.measure import measure, one_process_cluster
model, inputs = autopar.zoo.get("gpt", layers=8, width=384, heads=4, seq=16, batch=8, vocab=128)
plan = autopar.plan(model, inputs, one_process_cluster(8), zero=3, precision=sys.argv[1])
plan = plan.baselines["data_parallel"]
torch.set_num_threads(1)
m = measure(model, tuple(inputs), plan, rank=0, steps=2)
block = sum(p.numel() * p.element_size() for p in model.blocks[0].parameters())
whole = sum(p.numel() * p.element_size() for p in model.parameters())
json.dump(dict(zero=plan.strategy.options.zero, precision=plan.strategy.options.precision,
               predicted=m.predicted_memory, measured=m.measured_memory,
               state=m.state_bytes, block=block, whole=whole, blocks=len(model.blocks)), sys.stdout)
"""


@pytest.fixture(scope="module", params=["fp32", "bf16"])
def measured(request):
    r = subprocess.run([sys.executable, "-c", SCRIPT, request.param], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_zero3_rank_holds_two_blocks_whole_as_predicted(measured):
    m = measured
    assert m["zero"] == 3 and m["blocks"] == 8
    assert 0.85 <= m["measured"] / m["predicted"] <= 1.15, m
    # parameters and gradients whole (in the compute dtype: ``block`` is fp32's bytes): two blocks
    # at least (one running, one beside it), never all eight; the state between steps (shards,
    # optimizer) is about 1/8 of the model's
    whole = m["block"] * (0.5 if m["precision"] == "bf16" else 1.0)
    assert m["state"] < 0.5 * m["whole"], m
    assert m["state"] + 2 * 2 * whole < m["measured"] < m["state"] + 2 * 4 * whole, m


PIPELINED = """
import json, sys, torch, autopar
from autopar.cli.measure import measure, one_process_cluster
model, inputs = autopar.zoo.get("gpt", layers=8, width=384, heads=4, seq=16, batch=8, vocab=128)
plan = autopar.plan(model, inputs, one_process_cluster(8), hierarchical=True, zero=3, precision="bf16",
                    recompute=False, pin="tensor=1,pipeline=2,data=4").baselines["published"]
torch.set_num_threads(1)
m = measure(model, tuple(inputs), plan, rank=7, steps=2)
json.dump(dict(zero=plan.strategy.options.zero, stages=len(plan.stages), peak=plan.memory_per_device,
               measured=m.measured_memory, predicted=m.predicted_memory), sys.stdout)
"""


def test_zero3_pipeline_stage_holds_what_the_plan_prices():
    """ZeRO-3 inside pipeline stages (pipeline 2 x data 4, bf16): the last stage's rank, measured,
    holds the plan's peak (its shards, the root and two blocks whole in bf16) within 15%, and so
    what ``autopar measure`` prints as predicted for it (its stage's peak, the gathered blocks
    included); its inputs from the stage before are bf16, as the stage is compiled to take them."""
    r = subprocess.run([sys.executable, "-c", PIPELINED], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads(r.stdout.strip().splitlines()[-1])
    assert m["zero"] == 3 and m["stages"] == 2
    assert 0.85 <= m["measured"] / m["peak"] <= 1.15, m
    assert 0.85 <= m["measured"] / m["predicted"] <= 1.15, m
