"""The optimizer's update as a step pays it: each node's local shards timed on the device, the
whole model's per-element rate, and how much slower the ranks of a live group update at once.

``UpdateTiming`` is ``ProfiledModel``'s half that times and prices the update (a mixin: the
fields it reads, ``optimizer``, ``cache``, ``repeats``, ``update_rate``, ``share``,
``update_share`` and the rest, are the model's).

Why the ranks' update has its own scale (``update_share``): the update streams the optimizer's
state through memory, where the forward and backward's matmuls mostly run from the caches. Ranks
that share a host update at the same moment (each step ends with every rank's update, after the
gradients are synchronised), so each gets part of the memory bus: on the benchmarks' machine
(benchmarks/README.md) the zoo mlp's AdamW update took 5.5 ms on one rank alone and 7.7-8.1 ms
on each of two at once, half its shards 3.0 and 3.9-4.0 ms, and the steps of its plans spent
7.8-8.1 ms (replicated, data parallel) and 3.8 ms (half the state) in ``opt.step()``, where the
compute scale of the model's own ops (``run_share``) read about 1.0. So the live fit re-times the
whole-model update on every rank at once, on the wall clock, and prices every update term at
that reading's ratio to the profiled rate; without a live group the compute scale stands.
"""

from __future__ import annotations

import math

from autopar.cost_models.analytic import Term
from autopar.cost_models.profile_cache import Timing
from autopar.core.ir import Graph, Node
from autopar.core.tables import Config

# elements the whole-update rate is timed on (whole_update_rate): AdamW's 512 MiB, past any L3
UPDATE_RATE_ELEMENTS = 32 * 2 ** 20


def update_rate_shapes(graph: Graph, cap: int | None = None) -> tuple[list[tuple[tuple[int, ...], str]], int]:
    """The model's float parameter shapes the whole-update rate is timed on, the largest first, up
    to ``cap`` elements (default ``UPDATE_RATE_ELEMENTS``; a flat piece of the one that crosses
    it), and their element count."""
    from autopar.cost_models.op_runner import FLOAT

    cap = UPDATE_RATE_ELEMENTS if cap is None else cap
    seen: dict[str, tuple[tuple[int, ...], str]] = {}
    for n in graph.nodes:
        for p in n.params:
            if p.spec.dtype in FLOAT:
                seen[p.source] = (tuple(p.spec.shape), p.spec.dtype)
    shapes, total = [], 0
    for shape, dtype in sorted(seen.values(), key=lambda s: -math.prod(s[0])):
        room = cap - total
        if room <= 0:
            break
        if math.prod(shape) > room:  # a flat piece instead: no 4 GiB of state for a large embedding
            shape = (room,)
        shapes.append((shape, dtype))
        total += math.prod(shape)
    return shapes, total


def update_share(model, shapes, total: int, readings: int | None = None) -> float | None:
    """How much slower the live group's ranks run the whole-model update at once than the profile
    timed it (``model.update_rate``): per reading, every rank times the update of ``shapes``
    (``total`` elements) on the wall clock after a barrier (``UpdateTiming.update_seconds``), the
    slowest rank's over the profiled rate; the median over the readings. None without a group of
    two or more ranks, a profiled rate or an update the runner can time. Every rank must call it."""
    import time

    import torch.distributed as dist
    from autopar.cost_models.run_share import READINGS, in_group, median_share, slowest_rank

    if not in_group() or not shapes or total <= 0 or model.update_rate <= 0:
        return None
    ratios = []
    for _ in range(READINGS if readings is None else max(1, readings)):
        dist.barrier()
        try:
            ratio = model.update_seconds(shapes, time.perf_counter, dist.barrier) / total / model.update_rate
        except Exception:  # an update the runner cannot build here: this reading reads nothing
            ratio = 0.0
        ratios.append(slowest_rank(ratio if math.isfinite(ratio) else 0.0, model.device))
    return median_share(ratios)


class UpdateTiming:
    """The update's timings and its price per node (mixed into ``ProfiledModel``)."""

    def _optimizer_shapes(self, node: Node, config: Config) -> list[tuple[tuple[int, ...], str]]:
        from autopar.cost_models.op_runner import FLOAT, local_shape

        if not self.optimizer:
            return []
        return [(local_shape(node, config, p.spec), p.spec.dtype) for p in node.params
                if p.spec.dtype in FLOAT]

    def optimizer_signature(self, node: Node, config: Config) -> str | None:
        """The cache key of ``node``'s parameter update under ``config`` (None: nothing to update)."""
        shapes = self._optimizer_shapes(node, config)
        return repr(("optimizer", self.optimizer, "foreach, cold, less a scalar's", shapes)) if shapes else None

    def optimizer_timing(self, node: Node, config: Config) -> Timing | None:
        """The cached or measured update of ``node``'s local float parameters (None: none)."""
        sig = self.optimizer_signature(node, config)
        if sig is None:
            return None
        shapes = self._optimizer_shapes(node, config)
        hit = self.cache.get(self._device, self._torch, sig)
        if hit is not None:
            return hit
        timing = self._measure_optimizer(shapes)
        self.measurements += 1
        self.cache.put(self._device, self._torch, sig, timing)
        return timing

    def whole_update_rate(self, graph: Graph) -> float:
        """Seconds per element of one update of all of ``graph``'s float parameters at once (cached).

        A node's update timed alone (``optimizer_timing``) runs its handful of foreach passes over
        a few MiB that stay in the last-level cache between passes, even when it starts cold. In a
        step the one optimizer walks the whole model's state in each pass, and once that state
        outgrows the cache every pass streams from memory: on the benchmarks' machine (benchmarks/README.md)
        (32 MiB L3) AdamW took 1.8 ns per element over 1 M elements and 3.8-3.9 over 2-8 M, so
        bench-runtime's residual MLP (8.4 M) updated in 33 ms where its nodes timed alone summed
        to 18. The rate is measured on the model's own parameter shapes (``update_rate_shapes``:
        the largest first, up to ``UPDATE_RATE_ELEMENTS``, past which it no longer changes), the
        replicated case: a sharded plan's smaller state can only stream less, so its nodes are
        priced at least at their own timing and at most at this rate (``_optimizer_terms``).
        """
        shapes, total = update_rate_shapes(graph)
        if not self.optimizer or not shapes:
            return 0.0
        sig = repr(("optimizer rate", self.optimizer, "foreach, cold, less a scalar's, per element", shapes))
        hit = self.cache.get(self._device, self._torch, sig)
        if hit is None:
            t = self._measure_optimizer(shapes)
            hit = Timing(t.forward / total, 0.0, t.error) if not t.error else t
            self.measurements += 1
            self.cache.put(self._device, self._torch, sig, hit)
        return 0.0 if hit.error else hit.forward

    def update_seconds(self, shapes, now=None, sync=None) -> float:
        """Seconds of one update of parameters of ``shapes``, less an update of one scalar (what
        the model's one optimizer pays once a step, not once per node: the step's own Python and
        a dozen foreach calls, about 0.5 ms here; the zoo gpt's 16 parameter nodes summed to 13 ms
        with it, against 5 ms for its whole update), each starting cold, on one CPU thread.
        ``now``: the clock (default ``op_runner.clock``, where the scalar's update is timed once
        and kept); ``sync``: ``time_optimizer``'s, before each timed update."""
        import torch
        from autopar.cost_models.op_runner import EVICT_BYTES, time_optimizer

        threads = torch.get_num_threads()
        cpu = torch.device(self.device).type == "cpu"
        if cpu:
            torch.set_num_threads(1)
        try:
            if cpu and self._evict is None:
                self._evict = torch.empty(EVICT_BYTES // 4)
            args = (self.repeats, self.warmup, self.device, self._evict, now, sync)
            dtype = shapes[0][1]
            if now is not None:
                scalar = time_optimizer(self.optimizer, [((1,), dtype)], *args)
            else:
                if dtype not in self._scalar_update:
                    self._scalar_update[dtype] = time_optimizer(self.optimizer, [((1,), dtype)], *args)
                scalar = self._scalar_update[dtype]
            return max(time_optimizer(self.optimizer, shapes, *args) - scalar, 0.0)
        finally:
            if cpu:
                torch.set_num_threads(threads)

    def _measure_optimizer(self, shapes) -> Timing:
        from autopar.cost_models.op_runner import NotRunnable

        try:
            return Timing(self.update_seconds(shapes), 0.0)
        except NotRunnable as e:
            return Timing(None, None, str(e))
        except Exception as e:
            return Timing(None, None, f"{type(e).__name__}: {str(e)[:120]}")

    def _optimizer_terms(self, node: Node, config: Config, text: bool) -> list[Term]:
        o = self.optimizer_timing(node, config)
        if o is None or o.error:
            return []  # no parameters, or an update the runner cannot time: left unpriced
        why = f"{self.optimizer} update of the local parameter shards, median of {self.repeats} = {o.forward:.4g} s"
        seconds = o.forward
        elements = sum(math.prod(shape) for shape, _ in self._optimizer_shapes(node, config))
        if elements * self.update_rate > seconds:  # the whole model's state streams from memory
            seconds = elements * self.update_rate
            why += (f"; in the whole model's update, {elements} elements x {self.update_rate * 1e9:.3g} ns "
                    f"= {seconds:.4g} s (whole_update_rate)")
        if self.update_share is not None:
            seconds *= self.update_share
            why += f"; x {self.update_share:.3g}, the ranks updating at once on this host (update_share)"
        elif self.share != 1.0:
            seconds *= self.share
            why += f"; x {self.share:.3g}, the ranks computing at once on this host (compute_share)"
        return [Term("optimizer step (measured)", seconds, why if text else "", "optimizer")]
