"""The README's sample outputs are what the commands print today (issue 17), as
test_readme_tables.py does for the benchmark table: the sample plan report (rows abridged: every
README line is a line of the real report, in order; only the search's own seconds may differ), and
the compile snippet, run under torchrun on 2 processes, prints its report once, not once per rank.
"""

import re
import socket
import subprocess
import sys
from pathlib import Path

import autopar
from autopar.cli import main

ROOT = Path(__file__).resolve().parents[2]
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


def test_readme_compile_snippet_prints_the_report_once_under_torchrun(tmp_path):
    _, code = _block_after("## Train it", "```python")
    assert "autopar.compile(" in code
    script = tmp_path / "train.py"
    script.write_text(code)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--master-addr", "127.0.0.1", "--master-port", str(port), str(script)],
                       capture_output=True, text=True, timeout=300, env={"OMP_NUM_THREADS": "1",
                                                                          "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("autopar plan for ") == 1, r.stdout


def _report_on_each_rank(rank, world, path):
    model, inputs = autopar.zoo.get("gpt", layers=2, width=64, heads=4, seq=32, batch=8, vocab=256)
    return autopar.compile(model, inputs, plan=path).plan.report()


def test_every_rank_and_the_saved_plan_print_the_same_report(tmp_path):
    from autopar.codegen.launch import launch
    from autopar.planning.plan import Plan

    model, inputs = autopar.zoo.get("gpt", layers=2, width=64, heads=4, seq=32, batch=8, vocab=256)
    plan = autopar.plan(model, inputs, autopar.Cluster.preset("cpu", devices=2))
    path = tmp_path / "plan.json"
    plan.save(path)
    reports = launch(_report_on_each_rank, 2, str(path), timeout=300)
    assert reports[0] == reports[1] == Plan.load(path).report() == plan.report()
    assert "(8, 1, 1, 1)" not in reports[1] and "compute" in reports[1]
