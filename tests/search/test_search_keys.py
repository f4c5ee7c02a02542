"""Step keys (search/elimination.py) decide which steps the DP reuses, so they must be exact.

``_Symbolic.key`` encodes the factors around v as one flat tuple of ints; reuse is exact only if
that encoding is injective: two steps get equal keys exactly when the nested form
[(id, scope relabelled by first appearance), ...] is equal. Checked against the nested form on
many random factor sets, including ones built to collide under an encoding without lengths.
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np

from autopar.search.common import Problem
from autopar.search.elimination import Factor, _Symbolic


def _nested_key(by_var: set[Factor], v: int) -> tuple:
    """The key as first written: a tuple of (id, labelled scope) pairs."""
    inputs = sorted(by_var)
    labels = {v: 0}
    for f in inputs:
        for w in f.scope:
            labels.setdefault(w, len(labels))
    return tuple((f.fid, tuple(labels[w] for w in f.scope)) for f in inputs)


def _state(factors: list[Factor], n: int) -> _Symbolic:
    p = Problem(sizes=(2,) * n, node_cost=tuple(np.zeros(2) for _ in range(n)), edges={},
                memory=None, capacity=math.inf)
    return _Symbolic(p, factors)


def _random_factors(rng: random.Random, n: int) -> list[Factor]:
    """Factors over node 0 and a few others, ids from a small range so that ids repeat."""
    out = set()
    for _ in range(rng.randint(1, 4)):
        others = rng.sample(range(1, n), rng.randint(0, 2))
        scope = tuple(rng.sample([0, *others], len(others) + 1))
        out.add(Factor(rng.randint(0, 3), scope))
    return sorted(out)


def test_flat_key_is_equal_exactly_when_the_nested_key_is():
    rng = random.Random(0)
    n = 5
    # scopes of 1 to 3 variables in any order, ids 0..3: an encoding without the scope lengths
    # merges some of these (checked by hand: such a mutant fails here)
    sets = [_random_factors(rng, n) for _ in range(400)]
    flat, nested = [], []
    for factors in sets:
        flat.append(_state(factors, n).key(0)[0])
        nested.append(_nested_key(set(factors), 0))
    equal_pairs = 0
    for i, j in itertools.combinations(range(len(sets)), 2):
        assert (flat[i] == flat[j]) == (nested[i] == nested[j]), (sets[i], sets[j])
        equal_pairs += flat[i] == flat[j]
    assert equal_pairs > 0  # the random sets do repeat a pattern, so equality is exercised too


def test_key_is_invariant_under_renaming_the_other_variables():
    a = _state([Factor(7, (0, 3)), Factor(8, (0, 3, 4)), Factor(9, (0,))], 5)
    b = _state([Factor(7, (0, 1)), Factor(8, (0, 1, 2)), Factor(9, (0,))], 5)
    ka, kb = a.key(0), b.key(0)
    assert ka[0] == kb[0]
    assert ka[2] == (3, 4) and kb[2] == (1, 2)  # the message variables, in label order
