"""Resolve the MODEL argument of the command line: ``zoo:NAME[:key=value,...]`` or ``file.py:factory``.

A factory is a function of no arguments returning ``(model, example_inputs)``, the same contract as
``autopar.zoo.get``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from autopar import zoo


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def load(spec: str):
    """Return ``(model, example_inputs, name)`` for a MODEL argument; ValueError if it is bad."""
    if spec.startswith("zoo:"):
        name, _, args = spec[4:].partition(":")
        kwargs = {}
        for item in filter(None, args.split(",")):
            key, eq, val = item.partition("=")
            if not eq:
                raise ValueError(f"bad size {item!r} in {spec!r}: write key=value, e.g. zoo:gpt:layers=4")
            kwargs[key.strip()] = _value(val.strip())
        model, inputs = zoo.get(name, **kwargs)
        return model, inputs, name
    path, sep, fn = spec.rpartition(":")
    if not sep or not path.endswith(".py"):
        raise ValueError(f"bad MODEL {spec!r}: use zoo:NAME[:key=value,...] or path/to/file.py:factory")
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"no such file {path!r} (MODEL {spec!r})")
    module_spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    factory = getattr(module, fn, None)
    if not callable(factory):
        raise ValueError(f"{path} has no function {fn!r} (MODEL {spec!r})")
    result = factory()
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ValueError(f"{spec} must return (model, example_inputs), got {type(result).__name__}")
    model, inputs = result
    return model, tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,), file.stem
