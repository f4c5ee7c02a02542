"""benchmarks/README.md shows the strategy-quality table of the committed `make bench` run, not an older one.

Timing columns differ from run to run; the plan columns (costs, speedups, memory, fits) must be the
ones in benchmarks/results.md, which `make bench` writes.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLAN_COLUMNS = 10  # case .. fits (DP fits); the last three are timings


def _rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| case "):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[:PLAN_COLUMNS]
    return rows


def test_benchmarks_readme_table_is_the_committed_bench_run():
    results = _rows((ROOT / "benchmarks" / "results.md").read_text())
    readme_text = (ROOT / "benchmarks" / "README.md").read_text()
    section = readme_text.split("## Strategy quality and search speed", 1)[1].split("\n## ", 1)[0]
    readme = _rows(section)
    assert results, "benchmarks/results.md has no table"
    assert readme.keys() == results.keys(), "benchmarks/README.md and results.md list different cases"
    stale = [name for name in results if readme[name] != results[name]]
    assert not stale, f"benchmarks/README.md's table differs from results.md for {stale}: copy the table after make bench"
