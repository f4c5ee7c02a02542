"""The cost-vs-measured benchmark's host rule: an invocation whose replicated plan (no collective)
measured over the limit against its prediction is flagged, by model, and none under it."""

from benchmarks.fidelity_table import HOST_LIMIT, flagged


def _rows(ratio: float) -> list[dict]:
    return [dict(label="data parallel", predicted=1.0, measured=3.0),  # a plan that communicates: not the check
            dict(label="replicated = autopar best", predicted=2.0, measured=2.0 * ratio)]


def test_the_replicated_plan_over_the_limit_flags_its_model_only():
    got = flagged({"mlp": _rows(HOST_LIMIT + 0.01), "gpt": _rows(HOST_LIMIT - 0.01)})
    assert list(got) == ["mlp"] and got["mlp"] > HOST_LIMIT
    assert flagged({"gpt": _rows(1.0)}) == {}
