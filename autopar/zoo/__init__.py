"""Benchmark models: ``autopar.zoo.get(name, **sizes) -> (model, example_inputs)``.

Every model's ``forward(inputs, labels)`` returns the training loss (PaSE's graphs end in the loss,
and training is autopar's default objective). ``device="meta"`` builds the model without allocating
its weights, for tracing and planning models larger than the local machine.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Callable

# name -> "module:factory"; imported on first use so that `import autopar` stays light.
_MODELS = {
    "mlp": "autopar.zoo.mlp:mlp",
    "resmlp": "autopar.zoo.resmlp:resmlp",
    "cnn": "autopar.zoo.cnn:cnn",
    "gpt": "autopar.zoo.gpt:gpt",
    "alexnet": "autopar.zoo.alexnet:alexnet",
    "inception3": "autopar.zoo.inception3:inception3",
    "rnnlm": "autopar.zoo.rnnlm:rnnlm",
    "transformer": "autopar.zoo.transformer:transformer",
    "palm": "autopar.zoo.palm:palm",
    "moe": "autopar.zoo.moe:moe",
    "llama": "autopar.zoo.llama:llama",
    "llama3": "autopar.zoo.llama:llama3",
    # mixture-of-experts decoders (moe_decoder.py): routed experts on capacity buffers, MLA or GQA
    "moe_decoder": "autopar.zoo.moe_decoder:moe_decoder",
    "deepseek_v3": "autopar.zoo.moe_decoder:deepseek_v3",
    "mixtral_8x7b": "autopar.zoo.moe_decoder:mixtral_8x7b",
    # the largest published trainings (published.py: shapes and what their papers ran)
    "megatron_8b": "autopar.zoo.published:megatron_8b",
    "megatron_1t": "autopar.zoo.published:megatron_1t",
    "mt_nlg_530b": "autopar.zoo.published:mt_nlg_530b",
    "palm_540b": "autopar.zoo.published:palm_540b",
    "llama3_405b": "autopar.zoo.published:llama3_405b",
    "llama3_405b_long": "autopar.zoo.published:llama3_405b_long",
}

PASE_MODELS = ("alexnet", "inception3", "rnnlm", "transformer")
PUBLISHED_MODELS = ("megatron_8b", "megatron_1t", "mt_nlg_530b", "palm_540b", "llama3_405b", "llama3_405b_long")


def published_run(name: str):
    """What the paper of zoo model ``name`` ran (``published.PublishedRun``), or None."""
    from autopar.zoo.published import PUBLISHED

    return PUBLISHED.get(name)


def names() -> list[str]:
    return list(_MODELS)


def factory(name: str) -> Callable:
    if name not in _MODELS:
        raise ValueError(f"unknown zoo model {name!r}; known: {', '.join(_MODELS)}")
    mod, fn = _MODELS[name].split(":")
    return getattr(importlib.import_module(mod), fn)


def sizes(name: str) -> dict:
    """The size parameters a zoo model takes, with their defaults."""
    sig = inspect.signature(factory(name))
    return {k: p.default for k, p in sig.parameters.items()}


def get(name: str, **kwargs):
    """Build zoo model ``name`` with the given sizes; returns ``(model, example_inputs)``."""
    fn = factory(name)
    known = sizes(name)
    bad = [k for k in kwargs if k not in known]
    if bad:
        raise ValueError(
            f"zoo model {name!r} has no size {', '.join(map(repr, bad))}; "
            f"it takes: {', '.join(f'{k}={v}' for k, v in known.items())}"
        )
    for k, v in kwargs.items():
        default = known[k]
        if isinstance(default, int) and not isinstance(default, bool) and k != "seed":
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"zoo model {name!r}: {k} must be a positive int, not {v!r}")
    return fn(**kwargs)
