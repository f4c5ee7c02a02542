"""The command line as a user runs it: exit codes, one-line errors, what it prints.

Most cases call ``autopar.cli.main`` in this process (same parser, same error handling, no
interpreter start-up per case); one smoke test runs ``python -m autopar`` as a user would.
"""

import json
import subprocess
import sys

import pytest

import autopar
from autopar.cli import main
from tests.helpers.cli_utils import cli


@pytest.fixture
def run():
    return cli  # the command line in this process (tests/helpers/cli_utils.py)


def test_python_dash_m_autopar_runs_the_command_line():
    r = subprocess.run([sys.executable, "-m", "autopar", "trace", "zoo:mlp"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "linear" in r.stdout and "forward FLOPs" in r.stdout


def test_trace_prints_the_graph_table(run):
    r = run("trace", "zoo:mlp")
    assert r.returncode == 0, r.stderr
    assert "linear" in r.stdout and "forward FLOPs" in r.stdout


def test_plan_writes_json_and_picture_and_show_reads_it(run, tmp_path):
    out, pic = tmp_path / "plan.json", tmp_path / "plan.png"
    r = run("plan", "zoo:gpt:layers=2", "--cluster", "8xA100", "--json", str(out), "--png", str(pic))
    assert r.returncode == 0, r.stderr
    assert "vs data parallel" in r.stdout and "predicted step time" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["format"] == "autopar-plan" and doc["cluster"]["devices"] == 8
    assert pic.read_bytes()[:4] == b"\x89PNG"
    printed = r.stdout
    r = run("show", str(out))
    assert r.returncode == 0, r.stderr
    # the same report, read from the file alone (the plan command adds where it wrote its files)
    assert printed.startswith(r.stdout), "show must print what plan printed"
    assert printed[len(r.stdout):].splitlines() == [f"plan written to {out}", f"picture written to {pic}"]


def test_show_prints_the_same_report_for_pipelined_and_explained_plans(run, tmp_path):
    out = tmp_path / "piped.json"
    r = run("plan", "zoo:gpt:layers=2,width=256,heads=4,seq=64,batch=16", "--cluster", "2x8xH100",
            "--pipeline", "on", "--explain", "--json", str(out))
    assert r.returncode == 0, r.stderr
    printed = r.stdout.removesuffix(f"plan written to {out}\n")
    shown = run("show", str(out), "--explain").stdout
    assert shown == printed
    assert ("pipeline:" in shown) != ("the arithmetic (every term" in shown)  # explained unless pipelined


def test_compare_lists_three_plans(run):
    r = run("compare", "zoo:gpt:layers=2", "--devices", "4")
    assert r.returncode == 0, r.stderr
    for name in ("data parallel", "expert", "autopar"):
        assert name in r.stdout


@pytest.mark.parametrize("args,message", [
    (("plan", "zoo:resnet"), "unknown zoo model 'resnet'"),
    (("plan", "zoo:mlp", "--cluster", "9xTPU"), "unknown cluster preset"),
    (("plan", "zoo:mlp", "--devices", "0"), "--devices must be at least 1"),
    (("plan", "zoo:mlp:depth=3"), "has no size 'depth'"),
    (("plan", "nofile.py:f"), "no such file"),
    (("plan", "zoo:mlp", "--space", "pase:x"), "unknown space"),
    (("plan", "zoo:mlp", "--memory", "0"), "--memory is GiB per device and must be > 0"),  # was ignored
    (("plan", "zoo:mlp", "--memory", "-2"), "--memory is GiB per device and must be > 0"),
    (("plan", "zoo:gpt:layers=0"), "layers must be a positive int"),
])
def test_bad_input_is_one_line_and_exit_2(run, args, message):
    r = run(*args)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_corrupt_plan_file(run, tmp_path):
    f = tmp_path / "bad.json"
    f.write_text('{"format": "autopar-plan", "schema": 1')
    r = run("show", str(f))
    assert r.returncode == 2 and "invalid JSON" in r.stderr and "Traceback" not in r.stderr


def test_help_explains_every_option(run):
    r = run("plan", "--help")
    assert r.returncode == 0
    for opt in ("--devices", "--cluster", "--cost-model", "--space", "--search", "--json", "--svg", "--explain"):
        assert opt in r.stdout


def test_choices_and_help_come_from_the_registries(run):
    from autopar.planning import registry

    text = run("plan", "--help").stdout
    for table in (registry.COST_MODELS, registry.SEARCHES):
        for name, entry in table.items():
            assert name in text
            assert entry.help.split()[0] in text
    r = run("plan", "zoo:mlp", "--cost-model", "nope")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_a_profiled_plan_prices_its_pipeline_options_with_the_profiled_model(run, monkeypatch, tmp_path):
    """`autopar plan ... --cost-model profiled` on a multi-node cluster searches stages; the stage
    options must be priced by the plan's own (profiled) model, not a fresh analytic one."""
    from autopar.cost_models.profiled import ProfiledModel

    from autopar.planning import stages

    monkeypatch.setenv("AUTOPAR_CACHE", str(tmp_path / "p.sqlite"))
    seen = []
    real = stages.price_option

    def spy(graph, cluster, stages_, axes, micro, mode, optimizer, solve, model, *args, **kw):
        seen.append(model)
        return real(graph, cluster, stages_, axes, micro, mode, optimizer, solve, model, *args, **kw)

    monkeypatch.setattr(stages, "price_option", spy)
    r = run("plan", "zoo:mlp:layers=2", "--cluster", "2x2xH100", "--cost-model", "profiled", "--pipeline", "on")
    assert r.returncode == 0, r.stderr
    assert seen and all(isinstance(m, ProfiledModel) for m in seen)


FACTORIES = '''
import torch, torch.nn as nn

class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, mask=None):
        y = self.fc(x)
        return {"loss": (y * mask).sum() if mask is not None else y.sum(), "y": y}

def kw():
    torch.manual_seed(0)  # every process builds the same model and batch
    return M(), {"x": torch.randn(4, 8), "mask": torch.ones(4, 8)}

def three():
    return M(), (torch.randn(4, 8),), {"mask": torch.ones(4, 8)}
'''


@pytest.mark.slow  # three command-line runs
def test_model_files_may_give_keyword_inputs(run, tmp_path):
    f = tmp_path / "models.py"
    f.write_text(FACTORIES)
    r = run("trace", f"{f}:kw")
    assert r.returncode == 0, r.stderr
    assert "linear" in r.stdout
    r = run("plan", f"{f}:three", "--devices", "2")
    assert r.returncode == 0, r.stderr
    assert "predicted step time" in r.stdout
    r = run("run", f"{f}:kw", "--nproc", "2")  # keyword inputs compile and train like one process
    assert r.returncode == 0, r.stderr
    assert "equal" in r.stdout


def test_follow_option_plans_the_space_the_api_does(tmp_path):
    """`--follow on/off` is `autopar.plan(follow=True/False)`: the same cost, and the plan file says
    which space it is optimal over."""
    import json

    from autopar.planning.follow import DETAIL

    spec = "zoo:gpt:layers=1,width=64,heads=4,seq=16,batch=8,vocab=64"
    model, inputs = autopar.zoo.get("gpt", layers=1, width=64, heads=4, seq=16, batch=8, vocab=64)
    for flag, value in (("on", True), ("off", False)):
        path = tmp_path / f"{flag}.json"
        assert main(["plan", spec, "--cluster", "cpu", "--devices", "4", "--pipeline", "off", "--json", str(path)]
                    + ["--follow", flag]) == 0
        doc = json.loads(path.read_text())
        api = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=4), follow=value, pipeline=False)
        assert doc["cost"] == pytest.approx(api.cost, rel=1e-12)
        assert (DETAIL in doc["search"]["detail"]) is value
