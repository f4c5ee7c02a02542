"""The README is for a user, and no file of the repository carries work-log labels.

A user reads what autopar is, how to install it, a quickstart, what it supports and does not, one
figure per area with its benchmark file, how it works and how to contribute; benchmark tables live
in benchmarks/. Code, tests and docs say what and why; when and in which work item live in the
commits, so no file names numbered issues, numbered or earlier stops and sessions, the machine it
was developed on (the benchmark machine is described once, in benchmarks/README.md), or a path
outside the repository.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

SECTIONS = ("## Install", "## Quickstart", "## What it supports", "## Results", "## How it works",
            "## Contributing", "## License")
LABELS = [
    (re.compile(r"\b[Ii]ssues? #?\d+"), "an issue number"),
    (re.compile(r"\b[Ss]tops? \d+\b"), "a numbered stop"),
    (re.compile(r"\b[Ss]ession \d+\b"), "a numbered session"),
    (re.compile(r"\bS\d\d\b"), "a work-log label"),
    (re.compile(r"\bthis (?:\d+-core|shared|loaded)"), "the machine it was written on as 'this'"),
    (re.compile(r"\b(?:previous|last|earlier|next|later) (?:stop|session)\b"), "a stop or session of the work"),
    (re.compile(r"\bdevelop(?:ment|er's) (?:machine|box)|\b(?:machine|box) like ours|\b\d-core (?:machine|box)\b"),
     "the machine it was written on (say: the benchmark machine, benchmarks/README.md)"),
    (re.compile(r"\.\./shared|shared/[D]ESIGN|\bDESIGN[.]md|\breferenc[e]/pase"), "a file outside the repository"),
    (re.compile(r"\bthe issue's\b"), "an issue"),
]
ALLOWED = ("nccl-tests issue #",)  # citations of other projects' trackers


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / p for p in out if p.endswith((".py", ".md", ".cfg", ".toml", ".txt")) or p == "Makefile"]


def test_no_file_carries_work_log_labels():
    found = []
    for path in _tracked_text_files():
        if not path.is_file():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if any(a in line for a in ALLOWED):
                continue
            found += [f"{path.relative_to(ROOT)}:{n}: {what}: {line.strip()[:100]}"
                      for pattern, what in LABELS if pattern.search(line)]
    assert not found, "history belongs in commit messages:\n" + "\n".join(found[:40])


def test_the_readme_has_a_users_sections_in_order():
    at = [README.find(s) for s in SECTIONS]
    assert -1 not in at, f"README lacks {[s for s, a in zip(SECTIONS, at) if a == -1]}"
    assert at == sorted(at)
    assert "pip install ." in README and "make demo" in README and "make test" in README
    assert "docs/architecture.md" in README.split("## How it works", 1)[1]


def test_the_readme_links_resolve_and_its_tables_are_narrow():
    links = re.findall(r"\]\(([^)#]+)\)", README)
    assert links and all((ROOT / link).exists() for link in links), [x for x in links if not (ROOT / x).exists()]
    results = README.split("## Results", 1)[1].split("\n## ", 1)[0]
    assert {"benchmarks/results.md", "benchmarks/runtime.md", "benchmarks/scale.md"} <= set(links)
    assert results.count("](benchmarks/") >= 5  # a figure per area, each with its file
    widest = max((line.count("|") - 1 for line in README.splitlines() if line.startswith("|")), default=0)
    assert widest <= 3, "benchmark tables belong in benchmarks/README.md"
    assert len(README) < 16_000
