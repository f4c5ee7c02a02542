"""The floor of what a pipeline rank's backward holds beside its saved activations
(``backward_held.held_floors``) against every cut of a few units into the stages of a pipeline,
stage k on rank k mod p, priced as ``step_price.price`` prices them (``beside_saved``): each
rank's floor is at most what it holds under every cut and every layout whose cuts send at least
the floor's bytes and whose units rise at least their floors."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from autopar.planning.backward_held import beside_saved, held_floors


def _ranks(bounds: tuple, p: int) -> list[list[tuple[int, int]]]:
    ranks: list[list[tuple[int, int]]] = [[] for _ in range(p)]
    for k in range(len(bounds) - 1):
        ranks[k % p].append((bounds[k], bounds[k + 1]))
    return ranks


@pytest.mark.parametrize("p,v", [(2, 1), (3, 1), (2, 2), (3, 2), (2, 3)])
def test_each_ranks_floor_is_below_what_it_holds_under_every_cut(p, v):
    rng = np.random.default_rng(10 * p + v)
    checked = 0
    for _ in range(20):
        n = int(rng.integers(p * v, 9))
        boundary = rng.uniform(1.0, 4.0, size=n - 1)
        rise = rng.uniform(0.0, 5.0, size=n)
        held = [float(min(4, p - r + ((p - 1) / v if v > 1 else 0.0))) for r in range(p)]
        floors = held_floors(boundary, held, v, rise)
        for _ in range(3):  # layouts: each sends at least the bytes over the group, rises at least the floor
            s = SimpleNamespace(spans=[(i, i + 1) for i in range(n)],
                                sent=np.append(boundary * rng.uniform(1.0, 2.0, size=n - 1), 0.0),
                                backward=rise * rng.uniform(1.0, 2.0, size=n),
                                transient=np.append(np.zeros(n - 1), 1.0))  # the loss in the last unit
            for inner in itertools.combinations(range(1, n), p * v - 1):
                priced = beside_saved(s, _ranks((0, *inner, n), p), held)
                assert np.all(floors <= np.asarray(priced) * (1 + 1e-12) + 1e-12)
                checked += 1
        assert np.all(floors[:-1] > 0)
    assert checked > 0


def test_a_loss_outside_the_last_unit_leaves_the_rise_out():
    """Without the units' rise floors (a loss may lie on any rank) only the sends count; one stage
    holds nothing beside."""
    held = [2.0, 1.0]
    assert list(held_floors(np.array([3.0, 2.0]), held, 1)) == pytest.approx([2.0 * (2.0 + 1.0), 0.0])
    assert list(held_floors(np.array([3.0, 2.0]), held, 1, np.array([5.0, 1.0, 9.0]))) == pytest.approx([6.0 + 5.0, 0.0])
    assert list(held_floors(np.array([]), [1.0], 1)) == [0.0]
