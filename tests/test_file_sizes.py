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


def test_the_check_names_a_planted_long_file(tmp_path):
    folder = tmp_path / "search"
    folder.mkdir()
    for name, lines in (("long.py", LIMIT + 1), ("short.py", LIMIT)):
        (folder / name).write_text("x = 1\n" * lines)
    found = too_long(tmp_path)
    assert len(found) == 1 and found[0].startswith(f"search/long.py: {LIMIT + 1} lines"), found


def test_no_source_file_over_the_limit():
    assert too_long() == []
