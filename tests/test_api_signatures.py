"""The public entry points show their parameters: no ``**kwargs`` wrapper between the user and
the function that runs, options keyword-only, each with a docstring."""

import inspect

import pytest

import autopar


@pytest.mark.parametrize("name, positional", [
    ("plan", ["model", "example_inputs", "cluster"]),
    ("compile", ["model", "devices", "example_inputs"]),
    ("compile_many", ["models", "devices", "example_inputs"]),
    ("fuse", ["models", "example_inputs"]),
])
def test_entry_points_have_explicit_signatures(name, positional):
    fn = getattr(autopar, name)
    params = inspect.signature(fn).parameters.values()
    assert not [p for p in params if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)], f"autopar.{name} hides its options"
    assert [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD] == positional
    assert len(inspect.getdoc(fn) or "") > 200, f"autopar.{name} says too little"


def test_compile_takes_the_planning_options_plan_takes():
    """``compile`` forwards its planning options to ``autopar.plan``: the same names and defaults."""
    plan = inspect.signature(autopar.plan).parameters
    compile_ = inspect.signature(autopar.compile).parameters
    shared = [n for n in compile_ if n in plan and n not in ("model", "example_inputs", "example_kwargs", "cluster",
                                                            "devices")]
    assert len(shared) >= 15
    for n in shared:
        assert compile_[n].default == plan[n].default, n
