"""Small files named for what they hold: no Python file of the repository over 450 lines.

A file past that size holds more than one idea (the collective fit beside the profiled model, the
hardware datasheets beside the Cluster type); split it where the ideas part.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("autopar", "cost_models", "search", "codegen", "tests", "benchmarks", "examples")
LIMIT = 450


def too_long(root: Path = ROOT, limit: int = LIMIT) -> list[str]:
    out = []
    for folder in FOLDERS:
        for f in sorted((root / folder).rglob("*.py")):
            n = len(f.read_text().splitlines())
            if n > limit:
                out.append(f"{f.relative_to(root)}: {n} lines (at most {limit}: split it where its "
                           "ideas part)")
    return out


def test_no_source_file_over_the_limit():
    assert too_long() == []


def test_the_check_names_a_planted_long_file(tmp_path):
    (tmp_path / "codegen").mkdir()
    (tmp_path / "codegen" / "long.py").write_text("x = 1\n" * (LIMIT + 1))
    (tmp_path / "codegen" / "short.py").write_text("x = 1\n" * LIMIT)
    assert too_long(tmp_path) == [f"codegen/long.py: {LIMIT + 1} lines (at most {LIMIT}: split it where its "
                                  "ideas part)"]
