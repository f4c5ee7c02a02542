"""The pipeline path: a plan's stages cut from the traced graph and run by torch's pipelining.

In one process: every possible 2-stage cut of the MLP and the GPT, run stage after stage, gives
the model's own loss (so the cut, the tensors carried through stages and the recomputed shape
arithmetic are right), and plans that cannot run are refused with one-line errors.

On 2 gloo processes (one launch for every case, process start-up being the slow part): 2 stages x
1 device, GPipe, 1F1B and zero bubble with 2 and 4 microbatches, against the single-device run of
``tests/helpers/numerics.py``: the loss of each of 3 AdamW steps (on every rank), every parameter's
gradient after the first backward, every parameter after the last step. On 4 gloo processes the
same check for 2 stages x 2 devices, each stage Megatron-split (DTensor) on its own sub-mesh, under
GPipe, 1F1B and zero bubble (whose weight half of the backward must reach the sharded program's
parameters).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.tensor import DTensor

import autopar
from autopar.planning.plan import Plan, Stage
from autopar.codegen.pipeline import check_stages, pipeline_module, split_stages, stage_modules
from tests.helpers.dist_utils import run_gloo
from tests.helpers.mlp import plans
from tests.helpers.numerics import ATOL, EPS, LR, PARAM_ATOL, RTOL, STEPS, reference_run
from tests.helpers.plans import two_stage_plan

SIZES = {
    "mlp": dict(batch=8, inputs=8, hidden=16, layers=2, classes=4),
    "gpt": dict(batch=4, seq=8, width=16, heads=2, layers=2, vocab=32),
}
# (case name, model, schedule, microbatches, plan from JSON: no graph, so the model is re-traced)
CASES = [
    ("mlp-gpipe-2", "mlp", "gpipe", 2, False),
    ("mlp-1f1b-4", "mlp", "1f1b", 4, True),
    ("gpt-gpipe-2", "gpt", "gpipe", 2, False),
    ("gpt-1f1b-4", "gpt", "1f1b", 4, True),
    ("gpt-zero-bubble-4", "gpt", "zero-bubble", 4, True),
]
# 2 stages x 2 devices on 4 processes, each stage Megatron-split on its own 2-device sub-mesh
WIDE_CASES = [
    ("mlp-megatron-gpipe-2", "mlp", "gpipe", 2, False),
    ("gpt-expert-1f1b-2", "gpt", "1f1b", 2, True),
    ("gpt-expert-zero-bubble-2", "gpt", "zero-bubble", 2, False),
]


def run_stages(gm, parts, inputs):
    """The stage graphs one after another in this process, as the schedule would chain them."""
    import torch.fx as fx

    carried = ()
    names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    for k, part in enumerate(parts):
        mod = fx.GraphModule(gm, part.graph)
        if k == 0:
            out = mod(*inputs)
        else:
            out = mod(*carried, **dict(zip(names, inputs)))
        carried = out
    return out


# -- one process -------------------------------------------------------------------------------


OTHER_SIZES = {
    "cnn": dict(batch=4, channels=4, image=8, blocks=1, classes=4),
    "rnnlm": dict(batch=4, seq=4, vocab=16, units=8, layers=2),
    "transformer": dict(batch=4, seq=8, vocab=32, width=16, heads=2, hidden=32, layers=1),
}


@pytest.mark.parametrize("name", ["mlp", "gpt", "cnn", "rnnlm", "transformer"])
def test_every_cut_composes_to_the_model(name):
    model, inputs = autopar.zoo.get(name, **{**SIZES, **OTHER_SIZES}[name])
    model.eval()  # batch norm: the same statistics in every run
    graph = autopar.trace(model, inputs)
    names = [n.name for n in graph.nodes]
    expected = model(*inputs)
    for cut in range(1, len(names)):
        stages = check_stages([names[:cut], names[cut:]], names)
        parts = split_stages(graph.fx_graph, stages, inputs)
        assert parts[0].carried_in == [] and parts[1].carried_out == []
        assert parts[0].carried_out == parts[1].carried_in
        torch.testing.assert_close(run_stages(graph.fx_graph, parts, inputs), expected,
                                   rtol=0, atol=0, msg=lambda m: f"cut {cut}: {m}")


def test_three_stages_carry_a_tensor_through_the_middle():
    """GPT's residual stream (``add``) is read two stages later: the middle stage passes it on."""
    model, inputs = autopar.zoo.get("gpt", **SIZES["gpt"])
    graph = autopar.trace(model, inputs)
    names = [n.name for n in graph.nodes]
    a, b = names.index("blocks_0_ln1") + 1, names.index("blocks_0_attn_proj")
    parts = split_stages(graph.fx_graph, check_stages([names[:a], names[a:b], names[b:]], names),
                         inputs)
    assert "add" in parts[1].carried_in and "add" in parts[1].carried_out
    assert "add" not in parts[1].nodes
    torch.testing.assert_close(run_stages(graph.fx_graph, parts, inputs), model(*inputs))


def test_shape_arithmetic_is_recomputed_not_sent():
    """A cut between ``ln1`` and ``qkv``: the view sizes (ints) are recomputed in stage 1 from
    the carried ``ln1`` output; no int crosses the cut."""
    model, inputs = autopar.zoo.get("gpt", **SIZES["gpt"])
    graph = autopar.trace(model, inputs)
    names = [n.name for n in graph.nodes]
    cut = names.index("blocks_0_ln1") + 1
    parts = split_stages(graph.fx_graph, check_stages([names[:cut], names[cut:]], names), inputs)
    assert parts[0].carried_out == ["add", "blocks_0_ln1"]
    assert "getattr_2" in parts[1].nodes  # blocks_0_ln1.shape


@pytest.mark.parametrize("stages,world,message", [
    ("halves", 3, "need 2 processes"),
    ("swapped", 2, "not contiguous"),
    ("gap", 2, "not contiguous"),
    ("short", 2, "cover"),
    ("unknown", 2, "does not have"),
    ("wide", 3, "different device counts"),
    ("none", 2, "no pipeline stages"),
])
def test_unrunnable_stages_are_refused_in_one_line(stages, world, message):
    names = [f"n{i}" for i in range(6)]
    plans = {
        "halves": [Stage(names[:3], 1), Stage(names[3:], 1)],
        "swapped": [Stage(names[3:], 1), Stage(names[:3], 1)],
        "gap": [Stage(names[:2] + names[3:4], 1), Stage(names[2:3] + names[4:], 1)],
        "short": [Stage(names[:2], 1), Stage(names[2:5], 1)],
        "unknown": [Stage(names[:3], 1), Stage(names[3:] + ["x"], 1)],
        "wide": [Stage(names[:3], 2), Stage(names[3:], 1)],
        "none": [],
    }
    with pytest.raises(ValueError, match=message) as info:
        check_stages(plans[stages], names, world)
    assert "\n" not in str(info.value)


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(8, 4)
        self.mid = torch.nn.Linear(4, 4)

    def forward(self, idx, labels):
        logits = torch.nn.functional.linear(self.mid(self.emb(idx)), self.emb.weight)
        return torch.nn.functional.cross_entropy(logits, labels)


def test_a_tied_weight_across_stages_is_refused():
    model = Tied()
    inputs = (torch.randint(0, 8, (4,)), torch.randint(0, 8, (4,)))
    graph = autopar.trace(model, inputs)
    names = [n.name for n in graph.nodes]
    stages = check_stages([names[:1], names[1:]], names)
    with pytest.raises(ValueError, match="emb.weight.*tied") as info:
        stage_modules(model, graph.fx_graph, stages, inputs)
    assert "\n" not in str(info.value)
    # cut after the tied use: both reads of the weight in one stage, which is fine
    last = [n.name for n in graph.nodes].index("linear") + 1
    assert len(stage_modules(model, graph.fx_graph, check_stages([names[:last], names[last:]], names),
                             inputs)) == 2


# -- two gloo processes ------------------------------------------------------------------------


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def train_cases(rank, world, cases, devices=1, assignments=None):
    """Every case on this rank: losses per step, first gradients and final parameters."""
    out = {}
    for case, name, schedule, micro, from_json in cases:
        model, inputs = autopar.zoo.get(name, **SIZES[name])
        graph = autopar.trace(model, inputs)
        plan = two_stage_plan(graph, micro, schedule, devices=devices,
                              assignment=(assignments or {}).get(case))
        if from_json:
            plan = Plan.from_json(plan.to_json())
            assert plan.graph is None and len(plan.stages) == 2
        mod = pipeline_module(model, plan, inputs, graph=graph)
        opt = torch.optim.AdamW(mod.parameters(), lr=LR, eps=EPS)
        result = {"eval": mod(*inputs), "losses": [], "grads": {}}
        for step in range(STEPS):
            opt.zero_grad()
            loss = mod.train_step(*inputs)
            assert type(loss) is torch.Tensor and not loss.requires_grad
            result["losses"].append(loss)
            if step == 0:
                result["grads"] = {n: _full(p.grad).clone() for n, p in mod.named_parameters()}
            opt.step()
        result["params"] = {n: _full(p.detach()).clone() for n, p in mod.named_parameters()}
        out[case] = _plain(result)
    if devices == 1:
        bad = copy.deepcopy(plan)
        bad.stages.append(Stage([], 1))
        try:
            pipeline_module(model, bad, inputs, graph=graph)
            out["three_stages_on_two"] = "built"
        except ValueError as e:
            out["three_stages_on_two"] = str(e)
    return out


def _plain(value):
    """Tensors as numpy arrays: a tensor sent back from a child shares memory the child frees."""
    if isinstance(value, torch.Tensor):
        return value.detach().numpy()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _tensors(value):
    if isinstance(value, dict):
        return {k: _tensors(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tensors(v) for v in value]
    return torch.from_numpy(value) if hasattr(value, "dtype") else value


def _references():
    return {name: reference_run(*autopar.zoo.get(name, **sizes)) for name, sizes in SIZES.items()}


@pytest.fixture(scope="module")
def refs():
    return _references()


@pytest.fixture(scope="module")
def trained():
    return _tensors(run_gloo(train_cases, 2, CASES))


@pytest.fixture(scope="module")
def trained_wide():
    """Stage configs: Megatron for the MLP (``helpers/mlp.py``), the planner's expert
    (Megatron) baseline for the GPT, planned at microbatch size on a stage's 2 devices."""
    gpt_micro = autopar.zoo.get("gpt", **{**SIZES["gpt"], "batch": SIZES["gpt"]["batch"] // 2})
    expert = autopar.plan(*gpt_micro, autopar.Cluster(devices=2)).baselines["expert"]
    assert any(s > 1 for c in expert.assignment.values() for s in c.splits)
    assignments = {"mlp-megatron-gpipe-2": plans(2)["megatron"],
                   "gpt-expert-1f1b-2": expert.assignment, "gpt-expert-zero-bubble-2": expert.assignment}
    return _tensors(run_gloo(train_cases, 4, WIDE_CASES, 2, assignments))


def check_case(per_rank, ref, case, devices):
    ranks = [r[case] for r in per_rank]
    owned = [list(r["grads"]) for r in ranks]
    # each parameter in exactly one stage, under its own name; stage 0's come first
    assert owned[0] + owned[-1] == list(ref.params), owned
    assert owned[0] and owned[-1]
    assert all(o == owned[r // devices * devices] for r, o in enumerate(owned))
    for rank, r in enumerate(ranks):
        torch.testing.assert_close(r["eval"], ref.losses[0], rtol=RTOL, atol=ATOL,
                                   msg=lambda m: f"rank {rank} forward-only loss: {m}")
        for step, loss in enumerate(r["losses"]):
            torch.testing.assert_close(loss, ref.losses[step], rtol=RTOL, atol=ATOL,
                                       msg=lambda m: f"rank {rank} step {step} loss: {m}")
        for n, g in r["grads"].items():
            torch.testing.assert_close(g, ref.grads[n], rtol=RTOL, atol=ATOL,
                                       msg=lambda m, n=n: f"rank {rank} grad {n}: {m}")
        for n, p in r["params"].items():
            torch.testing.assert_close(p, ref.params[n], rtol=RTOL, atol=PARAM_ATOL,
                                       msg=lambda m, n=n: f"rank {rank} param {n}: {m}")


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("case,name", [(c[0], c[1]) for c in CASES])
def test_pipeline_matches_single_device(trained, refs, case, name):
    check_case(trained, refs[name], case, 1)


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("case,name", [(c[0], c[1]) for c in WIDE_CASES])
def test_sharded_stages_match_single_device(trained_wide, refs, case, name):
    check_case(trained_wide, refs[name], case, 2)


@pytest.mark.slow
@pytest.mark.dist
def test_stages_that_do_not_fit_the_processes_are_refused(trained):
    per_rank = trained
    for r in per_rank:
        msg = r["three_stages_on_two"]
        assert "need 3 processes" in msg and "has 2" in msg and "\n" not in msg, msg
