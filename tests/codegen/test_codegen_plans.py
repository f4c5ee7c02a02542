"""``follow`` (tests/helpers/plans.py), the hand-written plans' helper, does what it claims."""

from __future__ import annotations

from tests.helpers.plans import follow


def test_follow_makes_megatron_from_two_pins():
    import autopar

    model, inputs = autopar.zoo.get("mlp", batch=8, inputs=8, hidden=16, classes=4)
    g = autopar.trace(model, inputs)
    plan = follow(g, (2,), {"layers_0": {"n": (0,)}})
    assert plan["relu"].mesh_axes == ((), (0,))  # the activation stays column-split
    assert plan["layers_1"].mesh_axes == ((), (), (0,))  # and the next linear is row-parallel
    assert plan["relu_1"].mesh_axes == ((), ())  # partial sums are not followed
