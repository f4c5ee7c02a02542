"""Variable elimination over cost tables, with exact reuse of repeated work.

The DP eliminates nodes in an order (search/order.py); eliminating v replaces the factors that
mention v by one message over their other variables (search/minplus.py). This module plans that
run symbolically (which factors meet at each step, how big every message is, how much work is
left once repeats are reused) and then executes the plan.

Reuse, and why it is exact. Every factor carries an integer id. Two original tables (a node's cost
vector, an edge's matrix) get the same id only if they are equal element for element (checked
with ``np.array_equal``, not just a hash). A message's id is derived from its *step key*: the
sorted list of (id, variable pattern) of the factors it was computed from, with the variables
renamed by first appearance (v first). Equal keys mean equal input tables combined in the same
pattern, hence an equal message, so a step whose key was seen before takes the stored message
instead of recomputing it. Induction over the steps: equal ids imply equal tables.

When does this fire? Identical transformer layers have equal node vectors and edge matrices, so
every step that only touches one layer's own tables (and messages derived from them) has the same
key in every layer. Work that mixes a layer's tables with what flows in from the previous layer
is different in every layer and is computed each time, so the order matters: ``reuse_order``
eliminates the same interior node of all identical layers before touching their boundaries, which
leaves one reusable layer-to-layer message (on a chain of 12 attention blocks with 1000 configs
per node: 7e9 instead of 5e10 terms). The plan counts both kinds of step, and the DP picks the
candidate order whose *remaining* work is smallest.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .common import Problem, SearchTooLargeError
from .minplus import TILE_ELEMENTS, best_config, eliminate, table_elements
from .order import ORDERS, adjacency, order_iter

DEFAULT_MEMORY_BUDGET = 1 << 30  # bytes of messages the DP may keep


class Factor(NamedTuple):
    """A table by id over its variables (a tuple: hashed and ordered by (fid, scope) in C)."""

    fid: int
    scope: tuple[int, ...]


@dataclass(frozen=True)
class Step:
    """Eliminate ``v``: sum ``inputs``, minimise over v; the result is factor ``out``."""

    v: int
    inputs: tuple[Factor, ...]
    out: Factor
    reused: bool  # the message was computed at an earlier step with the same key
    work: int  # terms of the min-plus sum: |v| times the message size


@dataclass
class EliminationPlan:
    order_name: str
    order: list[int]
    steps: list[Step]
    constants: list[Factor]  # messages over no variable: their sum is the optimum
    work: int  # terms actually computed
    work_without_reuse: int
    message_bytes: int  # float64 messages kept alive until back-substitution
    largest_message: int  # elements
    reused_steps: int = 0
    widest: int = 0  # most variables in one message (numpy arrays take at most 64 axes)
    originals: dict[int, np.ndarray] = field(default_factory=dict, repr=False)


def _intern(tables: list[np.ndarray]) -> list[int]:
    """An id per table; equal ids exactly for equal tables (bucketed by a sample, then compared)."""
    buckets: dict[tuple, list[tuple[np.ndarray, int]]] = {}
    by_object: dict[int, int] = {}  # id(array) -> fid: cost models share one array per signature
    ids: list[int] = []
    count = 0
    for t in tables:
        if id(t) in by_object:  # ``tables`` keeps every array alive, so ids are not reused
            ids.append(by_object[id(t)])
            continue
        flat = t.reshape(-1)
        step = max(1, flat.size // 256)
        key = (t.shape, flat[::step].tobytes())
        bucket = buckets.setdefault(key, [])
        for other, fid in bucket:
            if np.array_equal(other, t):
                break
        else:
            fid, count = count, count + 1
            bucket.append((t, fid))
        by_object[id(t)] = fid
        ids.append(fid)
    return ids


def original_factors(p: Problem, node_cost: tuple[np.ndarray, ...]) -> tuple[list[Factor], dict[int, np.ndarray]]:
    tables = list(node_cost) + list(p.edges.values())
    scopes = [(i,) for i in range(p.n)] + list(p.edges.keys())
    ids = _intern(tables)
    factors = [Factor(fid, s) for fid, s in zip(ids, scopes)]
    return factors, {fid: t for fid, t in zip(ids, tables)}


class _Symbolic:
    """The factors alive during an elimination, by variable, and the step keys seen so far."""

    def __init__(self, p: Problem, factors: list[Factor]):
        self.sizes = p.sizes
        self.next_id = max((f.fid for f in factors), default=-1) + 1
        # A multiset per variable: two factors can be equal (same id, same scope), e.g. the
        # messages of two identical parallel branches into the same concat, and both count.
        self.by_var: list[Counter[Factor]] = [Counter() for _ in range(p.n)]
        for f in factors:
            for w in f.scope:
                self.by_var[w][f] += 1
        self.seen: dict[tuple, int] = {}

    def key(self, v: int) -> tuple[tuple, tuple[Factor, ...], tuple[int, ...]]:
        """(step key, input factors in key order, message variables in label order).

        The key is one flat tuple of ints, per input factor its id, its number of variables and
        their labels: an injective encoding of [(id, labelled scope), ...] that is built in one
        pass and allocates one tuple instead of two per factor (``reuse_order`` builds a key for
        every neighbour of every eliminated node)."""
        inputs = tuple(sorted(self.by_var[v].elements()))  # Factor tuples sort by (fid, scope)
        labels = {v: 0}
        flat: list[int] = []
        for fid, scope in inputs:
            flat.append(fid)
            flat.append(len(scope))
            for w in scope:
                label = labels.get(w)
                if label is None:
                    label = labels[w] = len(labels)
                flat.append(label)
        return tuple(flat), inputs, tuple(labels)[1:]

    def eliminate(self, v: int, reuse: bool, known: tuple | None = None) -> Step:
        """``known``: ``key(v)``, when the caller has it and nothing next to v changed since."""
        key, inputs, out_scope = known if known is not None else self.key(v)
        for f in set(inputs):
            for w in f.scope:
                del self.by_var[w][f]
        hit = reuse and key in self.seen
        if hit:
            fid = self.seen[key]
        else:
            fid, self.next_id = self.next_id, self.next_id + 1
            self.seen[key] = fid
        out = Factor(fid, out_scope)
        for w in out_scope:
            self.by_var[w][out] += 1
        work = table_elements(self.sizes, out_scope) * self.sizes[v]
        return Step(v, inputs, out, hit, work)


def reuse_order(p: Problem, factors: list[Factor], steps: list[Step] | None = None,
                defer: float = 1.0, ratio: float = 2.0, give_up_above: int | None = None
                ) -> list[int] | None:
    """Greedy on the work *left to compute*: a step whose key was seen costs nothing, and a step
    that n alive nodes share (the same node of n identical blocks, with the same factors around
    it) costs 1/n of its table, since the other n - 1 will reuse it. Table size (PaSE's dependent
    set, weighted by config counts) is the work, so without repeats this is ``min_weight``; with
    repeats it eliminates each block's interior first, everywhere at once, and leaves a chain of
    identical block-to-block messages, instead of dragging one block's message through the next
    (which makes every block's steps different).

    ``steps``: a list that receives the steps of the walk, which are those ``plan`` would give
    this order with reuse on (same start, same eliminations), so it need not walk it again.

    ``defer``: a step whose message reaches a node of more than ``ratio`` times the configs of
    the one eliminated counts ``defer`` times its work. Greedy on work alone eliminates a cheap
    small node early (a layer norm of 100 configs next to the residual of 400) and then carries
    the bigger neighbour through every later step of the block (each |v| * |next| * 400 instead
    of * 100); deferring such steps keeps the small node as the carried variable (on a 48-layer
    GPT over 64 devices: 1.6e9 terms instead of 3.9e9). ``choose_plan`` tries both.

    ``give_up_above``: return None as soon as the work computed (steps not reused) exceeds it,
    as ``plan`` does: ``choose_plan`` passes the least work found so far."""
    state = _Symbolic(p, factors)
    alive = set(range(p.n))
    cache: dict[int, tuple] = {}  # v -> its current step key
    known: dict[int, tuple] = {}  # v -> key(v), current: refreshed whenever v's factors change
    # The alive vertices by their current step key: every vertex of a group has the same
    # amortised score, so the step taken is the least (score, lowest vertex) over the groups,
    # the same as a min over all alive vertices, with one score per distinct key.
    groups: dict[tuple, list[int]] = {}  # key -> heap of vertices (stale entries skipped)
    members: Counter = Counter()  # key -> alive vertices whose current key it is (``sharing``)
    work_of: dict[tuple, float] = {}

    def refresh(v: int) -> None:
        if v in cache:
            members[cache[v]] -= 1
        known[v] = full = state.key(v)
        key, _, out_scope = full
        cache[v] = key
        if key not in work_of:
            # the step's sizes follow from its key (equal ids, equal tables), so this is per key
            work = table_elements(p.sizes, out_scope) * p.sizes[v]
            grows = (defer != 1.0 and p.sizes[v] > 1
                     and any(p.sizes[w] > ratio * p.sizes[v] for w in out_scope))
            work_of[key] = work * defer if grows else work
        members[key] += 1
        heapq.heappush(groups.setdefault(key, []), v)

    def lowest(key: tuple) -> int | None:
        heap = groups[key]
        while heap and not (heap[0] in alive and cache[heap[0]] == key):
            heapq.heappop(heap)
        return heap[0] if heap else None

    for v in sorted(alive):
        refresh(v)
    order = []
    so_far = 0
    while alive:
        best = None
        for key in list(groups):
            if members[key] <= 0:
                del groups[key]
                continue
            w = lowest(key)
            if w is None:  # cannot happen while members[key] > 0; kept for safety
                del groups[key]
                continue
            score = (0.0 if key in state.seen else work_of[key] / members[key], w)
            if best is None or score < best:
                best = score
        v = best[1]
        members[cache.pop(v)] -= 1
        step = state.eliminate(v, reuse=True, known=known.pop(v))
        alive.remove(v)
        order.append(v)
        if steps is not None:
            steps.append(step)
        if not step.reused:
            so_far += step.work
            if give_up_above is not None and so_far > give_up_above:
                return None
        for w in step.out.scope:
            refresh(w)
    return order


MAX_AXES = 60  # a message and its eliminated variable must stay under numpy's 64 axes

# reuse_order's variants by name -> their (defer, ratio)
REUSE_ORDERS = {"reuse": (1.0, 2.0), "reuse_defer": (16.0, 2.0)}


def plan(p: Problem, factors: list[Factor], order: list[int], order_name: str,
         reuse: bool = True, give_up_above: int | None = None,
         steps: list[Step] | None = None) -> EliminationPlan | None:
    """Walk the elimination symbolically: keys, reuse and sizes, no arithmetic on tables.

    ``give_up_above``: return None as soon as the computed work exceeds it (a candidate that
    cannot be the least work). ``steps``: the walk already done (``reuse_order``'s, reuse on)."""
    if steps is None:
        state = _Symbolic(p, factors)
        steps = []
        so_far = 0
        taken = []  # ``order`` may be an iterator (computed as it is walked): stopping stops it
        for v in order:
            taken.append(v)
            step = state.eliminate(v, reuse)
            steps.append(step)
            if not step.reused:
                so_far += step.work
                if give_up_above is not None and so_far > give_up_above:
                    return None
        order = taken
    constants = []
    work = total = message_elems = largest = reused_steps = widest = 0
    for step in steps:
        size = step.work // p.sizes[step.v]
        total += step.work
        largest = max(largest, size)
        widest = max(widest, len(step.out.scope))
        if step.reused:
            reused_steps += 1
        else:
            work += step.work
            message_elems += size
        if not step.out.scope:
            constants.append(step.out)
    if give_up_above is not None and work > give_up_above:
        return None
    return EliminationPlan(order_name, list(order), steps, constants, work, total,
                           8 * message_elems, largest, reused_steps, widest)


# graph-only work (terms) below which the reuse orders are not walked: a reuse walk re-keys every
# neighbour of every eliminated node, 0.2-0.9 s on a tensor group of a few hundred nodes, about
# what eliminating 2e7 terms takes, so below it the walk costs at least what it could save
REUSE_WORTH = 2e7


def choose_plan(p: Problem, factors: list[Factor], order: str = "auto", reuse: bool = True,
                memory_budget: float = DEFAULT_MEMORY_BUDGET, reuse_worth: float = REUSE_WORTH) -> EliminationPlan:
    """The plan with the least computed work among the candidate orders that fit the budget.

    The graph-only orders are walked first, each stopping once its work exceeds the least work of
    a fitting plan so far (it cannot be chosen). With ``order`` "auto" the reuse orders (usually
    the least work on repeated blocks: 1.6e9 terms against 3.9e9 on a 48-layer GPT) are walked
    next, the deferring one first, under the same early stop, unless the graph-only plan's work is
    below ``reuse_worth`` (``REUSE_WORTH``: the walk would cost what it could save). Ties go to
    the earlier name of ``auto``'s list, as a full comparison would."""
    known = [*ORDERS, *REUSE_ORDERS]
    names = known if order == "auto" else [order]
    if any(name not in known for name in names):
        raise ValueError(f"unknown elimination order {order!r}; one of auto, {', '.join(known)}")
    if not reuse and len(names) > 1:
        names = [name for name in names if name not in REUSE_ORDERS]
    adj = adjacency(p.n, p.edges.keys())

    def fits(pl: EliminationPlan) -> bool:
        return pl.message_bytes + 8 * TILE_ELEMENTS <= memory_budget and pl.widest < MAX_AXES

    plans: dict[str, EliminationPlan] = {}
    bound: int | None = None
    graph_only = [name for name in names if name not in REUSE_ORDERS]
    reusing = list(reversed([name for name in names if name in REUSE_ORDERS]))  # reuse_defer first
    for name in graph_only + reusing:
        if name in REUSE_ORDERS:
            if len(names) > 1 and bound is not None and bound < reuse_worth:
                break
            walked: list[Step] = []
            # the walk counts work with reuse on, at most the plan's work: a safe early stop
            o = reuse_order(p, factors, walked, *REUSE_ORDERS[name],
                            give_up_above=bound if reuse else None)
            pl = None if o is None else plan(p, factors, o, name, reuse,
                                             steps=walked if reuse else None)
        else:
            pl = plan(p, factors, order_iter(name, adj, p.sizes), name, reuse, give_up_above=bound)
        if pl is None:
            continue
        plans[name] = pl
        if fits(pl) and (bound is None or pl.work < bound):
            bound = pl.work
    done = [plans[name] for name in names if name in plans]
    fitting = [pl for pl in done if fits(pl)]
    if not fitting:
        best = min(done, key=lambda pl: pl.message_bytes)
        raise SearchTooLargeError(
            f"the exact DP needs {best.message_bytes / 2**30:.2f} GiB of tables (largest message "
            f"{best.largest_message} entries, order {best.order_name}), over its budget of "
            f"{memory_budget / 2**30:.2f} GiB; raise memory_budget, shrink the space, or use ilp")
    return min(fitting, key=lambda pl: (pl.work, pl.message_bytes))


def execute(pl: EliminationPlan, tables: dict[int, np.ndarray], sizes: tuple[int, ...]
            ) -> tuple[list[int], float]:
    """Run the plan; return the optimal choice (lowest config on ties) and the DP's optimum."""
    tables = dict(tables)
    scratch = np.empty(TILE_ELEMENTS)
    for st in pl.steps:
        if st.reused:
            continue
        inputs = [(tables[f.fid], f.scope) for f in st.inputs]
        tables[st.out.fid] = eliminate(inputs, st.v, st.out.scope, scratch)
    value = float(sum(float(tables[f.fid]) for f in pl.constants))
    chosen: dict[int, int] = {}
    for st in reversed(pl.steps):
        inputs = [(tables[f.fid], f.scope) for f in st.inputs]
        chosen[st.v] = best_config(inputs, st.v, chosen, sizes[st.v])
    return [chosen[i] for i in range(len(sizes))], value
