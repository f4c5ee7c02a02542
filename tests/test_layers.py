"""The packages' layers, checked on the source: imports go one way.

    core  <-  frontend, fusion, cost_models, search, codegen, pase  <-  report  <-  planning  <-  api/cli

``core`` (ir, tables, layout, cluster, errors, space, ...) imports nothing of autopar above it; the
middle layer's packages import only core (they never know of each other: a cost model does not
know which search reads its tables); ``report`` reads plans and PaSE's view; ``planning`` is the
one place that hands a cost model's tables to a search; the top-level modules (``autopar``,
``compiler``, ``cli``, ``training``, ``model_spec``, ...: ``API``) may use anything. ``zoo`` is a leaf:
benchmark models that import nothing of autopar. Every import counts, also one inside a function;
only ``if TYPE_CHECKING:`` blocks (annotations) are exempt. Modules must not import each other in a
cycle either (a cycle is two layers pretending to be one).

A package or top-level module the tables below do not name is an error (it has no layer until one
is given to it here), and so is an import of another module's private name (``from m import _x``:
make it public where it is used apart from its module, or move it), and, in the tests, benchmarks
and examples too, a bare ``codegen``/``search``/``cost_models`` import (a second module object
beside ``autopar.codegen``'s, whose monkeypatches and registries the library never sees).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# where each importable package's files live (setup.cfg's package_dir)
SOURCES = {"autopar": ROOT / "autopar", "autopar.cost_models": ROOT / "cost_models",
           "autopar.search": ROOT / "search", "autopar.codegen": ROOT / "codegen"}
LAYERS = ("core", "zoo", "frontend", "fusion", "cost_models", "search", "codegen", "pase", "report", "planning")
# the top-level modules of the API and command line (``autopar`` itself, ``autopar.cli``, ...)
API = ("__main__", "cli", "compiler", "many", "many_run", "measure", "model_spec", "parallel_module", "run_setup", "sweep",
       "training")
BARE = ("codegen", "search", "cost_models")  # packages installed under autopar, never importable alone
ALLOWED = {
    "core": set(),
    "zoo": set(),
    "frontend": {"core"},
    "cost_models": {"core"},
    "search": {"core"},
    "codegen": {"core"},
    "fusion": {"core"},
    "pase": {"core"},
    "report": {"core", "pase"},
    "planning": {"core", "frontend", "fusion", "cost_models", "search", "pase", "report"},
    "api": set(LAYERS),
}


def modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for pkg, folder in SOURCES.items():
        base = root / folder.relative_to(ROOT)
        for f in base.rglob("*.py"):
            rel = f.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([pkg, *parts])
            if pkg == "autopar" and parts and parts[0] in ("cost_models", "search", "codegen"):
                continue
            out[name] = f
    return out


def layer(module: str) -> str:
    """The module's layer: ``LAYERS`` by its package, "api" for ``API``, "unknown" otherwise."""
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in LAYERS:
        return parts[1]
    if len(parts) == 1 or parts[1] in API:
        return "api"
    return "unknown"


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(module: str, path: Path, known: set[str], private: list | None = None) -> list[tuple[int, str]]:
    """(line, imported autopar module) for every import in the file, TYPE_CHECKING blocks aside;
    ``private`` collects (line, "module.name") for each private name imported from another module."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    found = []

    def resolve(name: str) -> str | None:
        # "autopar.core.ir.Graph" -> the longest known module prefix
        parts = name.split(".")
        for k in range(len(parts), 0, -1):
            cand = ".".join(parts[:k])
            if cand in known:
                return cand
        return None

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for c in child.orelse:
                    visit(c)
                continue
            if isinstance(child, ast.Import):
                for a in child.names:
                    if a.name.split(".")[0] in ("autopar", *BARE):
                        found.append((child.lineno, a.name))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = module.split(".") if is_pkg else module.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (child.level - 1)]
                    base = ".".join(pkg + ([base] if base else []))
                if base.split(".")[0] in ("autopar", *BARE):
                    for a in child.names:
                        found.append((child.lineno, f"{base}.{a.name}"))
                        if private is not None and _private(a.name) and f"{base}.{a.name}" not in known:
                            private.append((child.lineno, f"{base}.{a.name}"))
            visit(child)

    visit(tree)
    out = []
    for line, name in found:
        if name.split(".")[0] != "autopar":
            out.append((line, name))  # a top-level codegen/search/cost_models import: always wrong
            continue
        target = resolve(name)
        if target is not None:
            out.append((line, target))
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def violations(root: Path = ROOT) -> list[str]:
    mods = modules(root)
    known = set(mods)
    bad = []
    for mod, path in sorted(mods.items()):
        src = layer(mod)
        if src == "unknown":
            bad.append(f"{path.relative_to(root)}: {mod} is in no layer: add its package to LAYERS or API "
                       "in tests/test_layers.py (and to docs/architecture.md's picture)")
            continue
        private = []
        for line, target in imports(mod, path, known, private):
            if not target.startswith("autopar"):
                bad.append(f"{path.relative_to(root)}:{line} imports {target}: use autopar.{target}")
                continue
            dst = layer(target)
            if dst == "unknown":  # said once, where the module itself is listed
                continue
            if dst == src or target == "autopar":
                if target == "autopar" and src != "api":
                    bad.append(f"{path.relative_to(root)}:{line} imports the autopar package itself")
                continue
            if dst not in ALLOWED.get(src, ()):
                bad.append(f"{path.relative_to(root)}:{line} ({src}) imports {target} ({dst})")
        for line, name in private:
            bad.append(f"{path.relative_to(root)}:{line} imports {name}, another module's private name: "
                       "make it public, or move it to where it is used")
    return bad


def bare_imports(root: Path = ROOT) -> list[str]:
    """Imports of ``codegen``/``search``/``cost_models`` as top-level packages in the tests,
    benchmarks and examples (the library's own modules are checked by ``violations``)."""
    bad = []
    for folder in ("tests", "benchmarks", "examples"):
        for f in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                for name in names:
                    if name.split(".")[0] in BARE:
                        bad.append(f"{f.relative_to(root)}:{node.lineno} imports {name}: use autopar.{name}")
    return bad


def cycles(root: Path = ROOT) -> list[list[str]]:
    mods = modules(root)
    known = set(mods)
    graph = {m: sorted({t for _, t in imports(m, p, known) if t in known and t != m
                        and not (m.startswith(t + ".") and mods[t].name == "__init__.py")})
             for m, p in mods.items()}
    # a package's __init__ re-exporting its own submodules is not a cycle
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    return out


def test_imports_go_one_way():
    assert violations() == []


def test_no_bare_imports_of_the_installed_packages():
    assert bare_imports() == []


def test_no_module_import_cycles():
    assert cycles() == []


def test_the_check_fails_on_a_planted_upward_import(tmp_path):
    """Copy the sources, plant core -> planning, and the check must name it."""
    import shutil

    for folder in ("autopar", "cost_models", "search", "codegen"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "autopar" / "core" / "errors.py"
    target.write_text(target.read_text() + "\n\ndef _late():\n    from autopar.planning import planner\n")
    found = violations(tmp_path)
    assert any("core/errors.py" in v and "autopar.planning.planner (planning)" in v for v in found), found
    # and a sibling import in the middle layer (a cost model that knows a search)
    target = tmp_path / "cost_models" / "memory.py"
    target.write_text(target.read_text() + "\nfrom autopar.search import dp  # planted\n")
    assert any("cost_models/memory.py" in v and "(search)" in v for v in violations(tmp_path))


def test_the_check_fails_on_an_unknown_package_a_private_import_and_a_bare_one(tmp_path):
    """An unlisted package has no layer; ``from m import _x`` across modules and a bare
    ``codegen`` import are named too (planted in a copy of the sources)."""
    import shutil

    for folder in ("autopar", "cost_models", "search", "codegen"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "autopar" / "extras").mkdir()
    (tmp_path / "autopar" / "extras" / "__init__.py").write_text("")
    target = tmp_path / "cost_models" / "memory.py"
    target.write_text(target.read_text() + "\nfrom autopar.cost_models.alpha_beta import _planted\n")
    found = violations(tmp_path)
    assert any("autopar.extras is in no layer" in v for v in found), found
    assert any("memory.py" in v and "autopar.cost_models.alpha_beta._planted" in v for v in found), found
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("from codegen.moves import move\nimport search.dp\n")
    assert bare_imports(tmp_path) == ["tests/test_x.py:1 imports codegen.moves: use autopar.codegen.moves",
                                      "tests/test_x.py:2 imports search.dp: use autopar.search.dp"]
