"""``autopar measure``: one rank of a plan for 8 devices, built and trained in one process over a
fake process group, its measured peak memory and compute beside the plan's.

The measured peak is checked against counts that do not come from the profiler: a rank holds at
least its parameters' local shards four times over at the end of a step without ZeRO (the
parameters, their gradients and AdamW's two moments), and a module built for the whole model
rather than this rank's shards would hold the whole model's parameters four times over.
"""

import json
import os
import re
import subprocess
import sys

import pytest

import autopar
from tests.helpers.cli_utils import cli, one_line_error

LAST = re.compile(r"memory measured/predicted: \d+\.\d\d; compute measured/predicted: \d+\.\d\d")


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("measure") / "m.json"
    # a memory budget that makes the search shard the weights (tensor parallel: ZeRO is off): a
    # 0.5578 GiB device leaves a plan about 2 MiB once the safety margin (10% + 512 MiB) is off
    r = subprocess.run([sys.executable, "-m", "autopar", "measure", "zoo:gpt", "--devices", "8", "--rank", "3",
                        "--zero", "0", "--memory", "0.5578", "--steps", "3", "--json", str(out)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    return r.stdout, json.loads(out.read_text())


def test_last_line_has_the_exact_format(measured):
    stdout, _ = measured
    assert LAST.fullmatch(stdout.strip().splitlines()[-1]), stdout


def test_peak_memory_holds_the_ranks_state_and_not_the_whole_model(measured):
    _, m = measured
    model, _ = autopar.zoo.get("gpt")
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    assert m["rank"] == 3 and m["devices"] == 8
    assert 0 < m["param_bytes"] <= whole / 2  # the plan shards the weights: this rank holds a part of them
    assert m["measured_memory"] >= 4 * m["param_bytes"]  # parameters, gradients, two Adam moments
    assert m["measured_memory"] < 4 * whole  # what a module of the whole model would hold at least
    assert m["predicted_memory"] > 0 and m["predicted_compute"] > 0 and m["measured_compute"] > 0


def test_a_rank_outside_the_plan_is_one_line():
    r = cli("measure", "zoo:gpt", "--devices", "8", "--rank", "8")
    assert one_line_error(r) and "--rank 8" in r.stderr


def test_a_pipelined_plan_is_refused_in_one_line_before_anything_is_built():
    from types import SimpleNamespace

    from autopar.cli.measure import measure

    model, inputs = autopar.zoo.get("gpt")
    with pytest.raises(ValueError, match="pipelined \\(2 stages\\)") as info:
        measure(model, inputs, SimpleNamespace(stages=[object(), object()], devices=8))
    assert len(str(info.value).splitlines()) == 1
