"""Every op family (``autopar.core.op_families``) names parts that exist, and every layer's
op-specific part is named by a family: a part forgotten on either side, or a misspelt op kind,
fails here. The source is read, not run, where a layer keys its part by comparing ``node.op``."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from autopar.core.op_families import FAMILIES, FX_KINDS, OpFamily, op_kinds

ROOT = Path(__file__).resolve().parents[1]


def _resolve(package: str, path: str):
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(f"{package}.{module}"), name)


def test_families_and_op_kinds_are_unique():
    names = [f.name for f in FAMILIES]
    assert len(names) == len(set(names))
    owned = [op for f in FAMILIES for op in f.ops]
    assert len(owned) == len(set(owned)) == len(op_kinds()), "an op kind owned by two families"
    assert not set(owned) & set(FX_KINDS)


def test_every_named_part_exists():
    from autopar.cost_models import runners
    from autopar.frontend.rules import RULES
    from autopar.fusion.nn_rules import FUNCTIONAL

    for f in FAMILIES:
        assert RULES[f.name] is _resolve("autopar.frontend.rules", f.rule), f.name
        if f.ops:  # measured by a runner, or said to be priced analytically: one of the two
            assert bool(f.runner) != bool(f.analytic), f"{f.name}: a runner or a reason, not both or neither"
        else:  # its rule emits other families' kinds, which are profiled as theirs
            assert not (f.runner or f.analytic), f.name
        if f.runner:
            assert callable(getattr(runners, f.runner)), f.name
        for repair in f.repairs:
            _resolve("autopar.codegen", repair)
        for call in f.fusion:
            assert call in FUNCTIONAL, f"{f.name}: no fusion rule for {call!r}"
    assert set(RULES) == set(names := [f.name for f in FAMILIES]) and len(names) == len(RULES)


def test_every_op_kind_is_profiled_or_priced_analytically():
    from autopar.cost_models.runners import RUNNERS

    for op, family in op_kinds().items():
        assert op in RUNNERS or family.analytic, op
    assert set(RUNNERS) <= set(op_kinds())


def _literal_ops(path: Path) -> set[str]:
    """The op kinds a rule module writes as a literal: ``Result("op", ...)``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Result" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                out.add(first.value)
    return out


def test_every_op_a_rule_writes_is_owned_by_a_family():
    written = set()
    for path in (ROOT / "autopar" / "frontend" / "rules").glob("*.py"):
        written |= _literal_ops(path)
    assert written and written <= set(op_kinds()), sorted(written - set(op_kinds()))


def test_a_rule_that_emits_an_unowned_op_gives_an_opaque_node(monkeypatch):
    """Kinds a rule computes (``conv{n}d``) are checked as the rule runs: an op kind no family
    owns would reach no runner and no repair, so the node is replicated and says why."""
    from autopar.frontend import rules
    from autopar.frontend.rules.base import Call, Result, Tensor

    x, y = Tensor((4, 8), "float32", "input:x"), Tensor((4, 8), "float32")
    monkeypatch.setitem(rules.RULES, "elementwise",
                        lambda call: Result("relu_with_a_typo", [], [(x, ((), ()))], [((), ())]))
    r = rules.apply(Call("elementwise", "torch.relu", {"args": (x,)}, (y,)))
    assert r.op == "opaque" and "owned by no family" in r.unsupported


def _op_tests(path: Path) -> list[tuple[str, str, bool]]:
    """(repair name, op literal, is a prefix) for each place a codegen module tests ``<x>.op``
    against an op kind: ``node.op == "sdpa"``, ``node.op in ADDITIVE_OPS``, ``WHOLE_DIMS.get(node.op)``,
    ``node.op.startswith("conv")``. The repair is the enclosing top-level function, or the
    module-level table the kinds are written in."""
    tree = ast.parse(path.read_text())
    tables = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name) and node.value is not None:
                tables[target.id] = node.value

    def strings(value) -> list[str]:
        if isinstance(value, ast.Call) and value.args:  # frozenset({...})
            value = value.args[0]
        if isinstance(value, ast.Dict):
            return [k.value for k in value.keys if isinstance(k, ast.Constant)]
        if isinstance(value, (ast.Set, ast.Tuple, ast.List)):
            return [e.value for e in value.elts if isinstance(e, ast.Constant)]
        return [value.value] if isinstance(value, ast.Constant) and isinstance(value.value, str) else []

    def is_op(e) -> bool:
        return isinstance(e, ast.Attribute) and e.attr == "op"

    out = []
    stem = path.stem
    for top in tree.body:
        where = f"{stem}.{getattr(top, 'name', '')}"
        for node in ast.walk(top):
            if isinstance(node, ast.Compare) and is_op(node.left):
                for cmp in node.comparators:
                    if isinstance(cmp, ast.Name) and cmp.id in tables:
                        out += [(f"{stem}.{cmp.id}", s, False) for s in strings(tables[cmp.id])]
                    else:
                        out += [(where, s, False) for s in strings(cmp)]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
                if node.func.attr == "startswith" and is_op(node.func.value):
                    out += [(where, s, True) for s in strings(node.args[0])]
                elif (node.func.attr == "get" and is_op(node.args[0]) and isinstance(node.func.value, ast.Name)
                      and node.func.value.id in tables):
                    name = node.func.value.id
                    out += [(f"{stem}.{name}", s, False) for s in strings(tables[name])]
    return [t for t in out if t[1] not in FX_KINDS]


def repair_findings(root: Path = ROOT, families: tuple[OpFamily, ...] = FAMILIES) -> list[str]:
    kinds = op_kinds(families)
    bad = []
    for path in sorted((root / "codegen").glob("*.py")):
        for repair, op, prefix in _op_tests(path):
            owners = {f for k, f in kinds.items() if (k.startswith(op) if prefix else k == op)}
            if not owners:
                bad.append(f"codegen/{path.name}: {repair} tests op {op!r}, which no family owns")
            for f in owners:
                if repair not in f.repairs:
                    bad.append(f"codegen/{path.name}: {repair} repairs {op!r}, which family {f.name!r} "
                               "does not name among its repairs")
    return bad


def test_every_codegen_repair_is_named_by_the_families_of_its_ops():
    assert repair_findings() == []


def test_the_repair_check_names_a_misspelt_op_and_a_forgotten_repair(tmp_path):
    (tmp_path / "codegen").mkdir()
    (tmp_path / "codegen" / "fixes.py").write_text(
        'def causal(node):\n    return node.op == "spda"\n\n\n'
        'def vocab(node):\n    return node.op != "embedding"\n')
    assert repair_findings(tmp_path) == [
        "codegen/fixes.py: fixes.causal tests op 'spda', which no family owns",
        "codegen/fixes.py: fixes.vocab repairs 'embedding', which family 'embedding' does not name among "
        "its repairs"]


def test_every_op_specific_fusion_rule_belongs_to_one_family():
    from autopar.fusion.nn_rules import FUNCTIONAL

    named = [call for f in FAMILIES for call in f.fusion]
    assert len(named) == len(set(named))
    assert set(named) == set(FUNCTIONAL), sorted(set(FUNCTIONAL) ^ set(named))


def test_a_family_module_may_not_take_a_call_another_site_has(monkeypatch):
    from autopar.frontend.rules import MODULES, sites

    assert sites.COMMON["topk"][0] == "topk"  # a family module's own SITES reach the tables
    monkeypatch.setattr(MODULES["topk"], "SITES", {"relu": ("topk", "input, k", {})}, raising=False)
    with pytest.raises(ValueError, match="rules.topk.SITES: the call 'relu' already has a site"):
        sites._family_sites()
