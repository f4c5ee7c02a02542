"""Resolve the MODEL argument of the command line: ``zoo:NAME[:key=value,...]`` or ``file.py:factory``.

A factory is a function of no arguments returning ``(model, example_inputs)`` (the contract of
``autopar.zoo.get``; ``example_inputs`` a tuple of positional inputs, one tensor, or a dict of
keyword inputs as Hugging Face models take them) or ``(model, args, kwargs)``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
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
    """``(model, example_inputs, name)`` for commands that take positional inputs only; ValueError if bad."""
    model, args, kwargs, name = load_call(spec)
    if kwargs:
        raise ValueError(f"{spec} gives keyword inputs ({', '.join(kwargs)}), which this command does not take "
                         f"yet: use `autopar trace` or `autopar plan`, or return positional inputs")
    return model, args, name


def load_call(spec: str):
    """Return ``(model, args, kwargs, name)`` for a MODEL argument; ValueError if it is bad."""
    if spec.startswith("zoo:"):
        name, _, args = spec[4:].partition(":")
        kwargs = {}
        for item in filter(None, args.split(",")):
            key, eq, val = item.partition("=")
            if not eq:
                raise ValueError(f"bad size {item!r} in {spec!r}: write key=value, e.g. zoo:gpt:layers=4")
            kwargs[key.strip()] = _value(val.strip())
        model, inputs = zoo.get(name, **kwargs)
        return model, _positional(inputs), {}, name
    path, sep, fn = spec.rpartition(":")
    if not sep or not path.endswith(".py"):
        raise ValueError(f"bad MODEL {spec!r}: use zoo:NAME[:key=value,...] or path/to/file.py:factory")
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"no such file {path!r} (MODEL {spec!r})")
    module_spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's file: say where, in one line
        raise ValueError(f"{path} fails on import: {_where(e)}{type(e).__name__}: {e}") from None
    factory = getattr(module, fn, None)
    if not callable(factory):
        raise ValueError(f"{path} has no function {fn!r} (MODEL {spec!r})")
    result = _call_factory(factory, spec)
    if not (isinstance(result, tuple) and len(result) in (2, 3)):
        raise ValueError(f"{spec} must return (model, example_inputs) or (model, args, kwargs), "
                         f"got {type(result).__name__}")
    from torch import nn

    if not isinstance(result[0], nn.Module):  # a function or a built model's output: say so before any use
        raise ValueError(f"{spec} returned a {type(result[0]).__name__} where the model goes: return "
                         f"(model, example_inputs) with model a torch.nn.Module (wrap a function in one)")
    if len(result) == 3:
        model, args, kwargs = result
        if not isinstance(kwargs, Mapping):
            raise ValueError(f"{spec} returned (model, args, kwargs) with kwargs a {type(kwargs).__name__}, not a dict")
        return model, _positional(args), dict(kwargs), file.stem
    model, inputs = result
    if isinstance(inputs, Mapping):  # keyword inputs, as Hugging Face models are called
        return model, (), dict(inputs), file.stem
    return model, _positional(inputs), {}, file.stem


def _call_factory(factory, spec: str):
    """``factory()``; a factory that needs arguments or raises is a one-line ValueError saying where."""
    import inspect

    try:
        inspect.signature(factory).bind()
    except TypeError:
        raise ValueError(f"{spec}: the factory must take no arguments (it has {inspect.signature(factory)}): "
                         "wrap it, e.g. def make(): return factory(size=...)") from None
    except ValueError:  # no signature to read (a builtin): just call it
        pass
    try:
        return factory()
    except Exception as e:  # noqa: BLE001 - the user's code: its error, where it happened, in one line
        raise ValueError(f"{spec} raised {type(e).__name__}: {e} ({_where(e)}fix the factory)") from None


def _where(e: BaseException) -> str:
    """"file.py:12: " of the innermost frame, or ""."""
    import traceback

    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if not f.filename.startswith("<") and f.filename != __file__]
    return f"{frames[-1].filename}:{frames[-1].lineno}: " if frames else ""


def _positional(inputs) -> tuple:
    return tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
