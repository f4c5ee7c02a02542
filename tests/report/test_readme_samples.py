"""The README's samples are what the code does today: the sample plan report (rows abridged:
every README line is a line of the real report, in order; only the search's own seconds may
differ), the quickstart run exactly as printed under torchrun, and the compile_many snippet.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import autopar
from autopar.cli import main

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")
README = (ROOT / "README.md").read_text()


def _block_after(marker: str, fence: str = "```") -> tuple[str, str]:
    """The first fenced block after ``marker``: (the text before it from the marker, its body)."""
    at = README.index(marker)
    start = README.index(fence, at)
    body_start = README.index("\n", start) + 1
    return README[at:start], README[body_start:README.index("```", body_start)]


def _timeless(line: str) -> str:
    return re.sub(r"search: (\S+) in [0-9.e+-]+ s", r"search: \1 in ? s", line)


def test_readme_sample_plan_is_what_the_command_prints(capsys):
    intro, sample = _block_after("Plan it for a cluster and see why")
    command = re.search(r"`autopar plan ([^`]+)`", intro)[1].split()
    assert main(["plan", *command]) == 0
    printed = [_timeless(x) for x in capsys.readouterr().out.splitlines()]
    shown = [_timeless(x) for x in sample.splitlines()]
    assert shown[:8] == printed[:8], "README's report header is stale: paste the command's output"
    at = 0
    for line in shown[8:]:  # rows abridged: each README row is a printed row, in order
        assert line in printed[at:], f"README row not printed (in this order) by autopar plan: {line!r}"
        at = printed.index(line, at) + 1


def _run(argv: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def test_readme_quickstart_runs_as_printed_and_trains_like_one_device(tmp_path):
    """The quickstart, saved and started exactly as the README says, trains on 2 gloo processes:
    its losses are a plain single-process AdamW loop's, and the report is printed once."""
    intro, code = _block_after("## Quickstart", "```python")
    command = re.search(r"run `(torchrun [^`]+)`", intro)[1]
    assert command == "torchrun --standalone --nproc-per-node 2 quickstart.py"
    assert len(code.strip().splitlines()) <= 12, "the quickstart is about ten lines"
    (tmp_path / "quickstart.py").write_text(code)
    r = _run([str(TORCHRUN), *command.split()[1:]], tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.count("autopar plan for ") == 1, r.stdout
    printed = [float(x) for x in re.findall(r"^step \d+: loss (\S+)$", r.stdout, flags=re.M)]

    scope = {"autopar": autopar}  # the model as the quickstart builds it, trained on one process
    exec(next(line for line in code.splitlines() if "autopar.zoo.get(" in line), scope)
    model, tokens, labels = scope["model"], scope["tokens"], scope["labels"]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    alone = []
    for _ in range(3):
        loss = model(tokens, labels)
        loss.backward(); opt.step(); opt.zero_grad()
        alone.append(loss.item())
    assert printed == pytest.approx(alone, rel=1e-5)


def _snippet_after(marker: str) -> str:
    return _block_after(marker, "```python")[1]


@pytest.mark.slow
def test_readme_compile_many_snippet_runs_and_without_its_guard_says_so(tmp_path):
    """The README's compile_many snippet runs as a script; without its ``__main__`` guard the
    processes it starts import the script again: one line says to add the guard, and nothing is
    planned or printed twice (before: the report three times, then multiprocessing's
    "bootstrapping phase" RuntimeError)."""
    code = _snippet_after("## Many models at once")
    assert 'if __name__ == "__main__":' in code
    (tmp_path / "sweep.py").write_text(code)
    r = _run([sys.executable, "sweep.py"], tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.count("models on 2 devices") == 1, r.stdout

    lines = code.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("if __name__"))
    unguarded = lines[:at] + [line[4:] for line in lines[at + 1:]]
    (tmp_path / "unguarded.py").write_text("\n".join(unguarded) + "\n")
    r = _run([sys.executable, "unguarded.py"], tmp_path)
    assert r.returncode == 1
    assert r.stdout.count("models on 2 devices") == 1, r.stdout
    assert 'if __name__ == "__main__":' in r.stderr.strip().splitlines()[-1]
    assert "bootstrapping" not in r.stderr, r.stderr[-3000:]


def _report_on_each_rank(rank, world, path):
    model, inputs = autopar.zoo.get("gpt", layers=2, width=64, heads=4, seq=32, batch=8, vocab=256)
    return autopar.compile(model, inputs, plan=path).plan.report()


def test_every_rank_and_the_saved_plan_print_the_same_report(tmp_path):
    from autopar.runtime.launch import launch
    from autopar.planning.plan import Plan

    model, inputs = autopar.zoo.get("gpt", layers=2, width=64, heads=4, seq=32, batch=8, vocab=256)
    plan = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=2))
    path = tmp_path / "plan.json"
    plan.save(path)
    reports = launch(_report_on_each_rank, 2, str(path), timeout=300)
    assert reports[0] == reports[1] == Plan.load(path).report() == plan.report()
    assert "(8, 1, 1, 1)" not in reports[1] and "compute" in reports[1]
