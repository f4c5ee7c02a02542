"""Fixtures more than one test module reads, each built once per test run (tracing and planning
these take seconds: building them per module made the suite pay twice).

``piped_gpt``: a 4-layer GPT planned on two 8-GPU nodes joined by a slow link (0.2 GB/s), where
the pipeline wins (test_planner shows why); read by the report and search-status tests.
``hf_traced``: the six Hugging Face families of ``tests/helpers/hf_models.py``, traced; read by the
tracer's and the planner's tests. Tests only read them: none may change a model or a plan.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch

import autopar


@dataclass(frozen=True)
class Piped:
    plan: autopar.Plan
    model: torch.nn.Module
    inputs: tuple
    cluster: autopar.Cluster


@pytest.fixture(scope="session")
def piped_gpt() -> Piped:
    model, inputs = autopar.zoo.get("gpt", layers=4, width=1024, heads=16, seq=512, batch=32, vocab=32768,
                                    device="meta")
    slow = dataclasses.replace(autopar.Cluster.preset("2x8xH100"), inter_bandwidth=2e8, name="slow-ib")
    plan = autopar.plan(model, inputs, slow, pipeline=True, precision="fp32")
    assert plan.stages, "a slow inter-node link makes the pipeline win (see test_planner)"
    return Piped(plan, model, inputs, slow)


@pytest.fixture(scope="session")
def hf_traced() -> dict:
    """name -> (model, kwargs, graph) for every family of hf_models.NAMES."""
    from tests.helpers import hf_models  # imports transformers: only test runs that ask pay for it

    out = {}
    for name in hf_models.NAMES:
        model, kwargs = hf_models.build(name)
        out[name] = (model, kwargs, autopar.trace(model, kwargs))
    return out


def _starts_processes(item) -> bool:
    return item.get_closest_marker("dist") is not None or item.get_closest_marker("slow") is not None


def pytest_configure(config):
    """Under ``-n 2 --dist loadscope`` (``make test``) modules go to the workers in collection order
    (below), not xdist's default of most tests first: that default hands out last the modules of a
    few long tests (gloo launches, examples started with torchrun), and one of them at the end keeps
    one worker busy for a minute while the other has nothing left to do."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Modules with tests marked ``slow`` or ``dist`` (they start processes) first, then the rest,
    each group in collection order: the long modules start early and the short ones fill in at the
    end. A module's tests stay together and in their order (its fixtures are built once)."""
    def module(item):
        return getattr(getattr(item, "module", None), "__name__", None)

    heavy = {module(item) for item in items if _starts_processes(item)} - {None}
    items.sort(key=lambda item: module(item) not in heavy)
