"""The cost-vs-measured benchmark's host rule: an invocation whose replicated plan (no collective)
measured off its prediction by more than the tolerance, either way, is flagged, by model."""

from benchmarks.fidelity_table import HOST_LIMIT, flagged


def _rows(ratio: float) -> list[dict]:
    return [dict(label="data parallel", predicted=1.0, measured=3.0),  # a plan that communicates: not the check
            dict(label="replicated = autopar best", predicted=2.0, measured=2.0 * ratio)]


def test_the_replicated_plan_over_the_limit_flags_its_model_only():
    got = flagged({"mlp": _rows(1 + HOST_LIMIT + 0.01), "gpt": _rows(1 + HOST_LIMIT - 0.01),
                   "resmlp": _rows(1 - HOST_LIMIT - 0.01), "gpt16": _rows(1 - HOST_LIMIT + 0.01)})
    assert sorted(got) == ["mlp", "resmlp"]  # a host slower or faster in the steps than in the profile
    assert flagged({"gpt": _rows(1.0)}) == {}
