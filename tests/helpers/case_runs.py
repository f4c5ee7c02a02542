"""Many small models, each under several plans, checked against one device in one gloo launch.

A case is ``(name, frontend, kind)``: the model ``build(name)`` makes, traced by ``frontend``, run
under ``kind``: "searched" (``autopar.compile``'s own plan: rank 0 plans, every rank compiles it),
"data_parallel", or "split_everything" (every splittable dim over the mesh). One launch serves all
cases, and a case that fails reports its error instead of stopping the others.
"""

from __future__ import annotations

import pytest

import autopar
from autopar.codegen.module import shard_module
from autopar.core.tables import Mesh
from tests.helpers.dist_utils import run_gloo
from tests.helpers.numerics import check_module, reference_run
from tests.helpers.plans import data_parallel, split_everything


def train_cases(rank, world, cases, build, trace) -> dict:
    """Every case on this rank: None where it trains like one device, else its error.
    ``build(name) -> (model, inputs)``; ``trace(model, inputs, frontend) -> Graph``."""
    out = {}
    for case in cases:
        name, frontend, kind = case
        model, inputs = build(name)
        ref = reference_run(model, inputs)
        try:
            graph = trace(model, inputs, frontend)
            assert frontend == "auto" or graph.frontend == frontend
            if kind == "searched":
                module = autopar.compile(model, example_inputs=inputs)
            else:
                plan = data_parallel(graph, (world,)) if kind == "data_parallel" else \
                    split_everything(graph, Mesh((world,)))
                module = shard_module(model, graph, plan, (world,))
            check_module(rank, module, inputs, ref)
            out[case] = None
        except Exception as e:  # noqa: BLE001 - each case reports its own failure
            out[case] = f"{type(e).__name__}: {str(e)[:600]}"
    return out


def case_ids(cases) -> list[str]:
    """pytest ids of the cases: 'name-frontend-kind'."""
    return ["-".join(c) for c in cases]


def check_case(trained: list[dict], case) -> None:
    """Every rank's result of ``case`` (``train_cases``' return per rank) is None: no error."""
    for rank, results in enumerate(trained):
        assert results[case] is None, f"rank {rank}: {results[case]}"


def cases_fixture(cases, build, trace):
    """A module-scoped fixture: every case trained on 2 gloo processes, in one launch."""

    @pytest.fixture(scope="module")
    def trained():
        return run_gloo(train_cases, 2, cases, build, trace)

    return trained
