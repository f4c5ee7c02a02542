"""The collectives a sharded module issues are the ones its plan predicts.

For each plan, ``cost_models.collectives.predicted_collectives`` lists what the analytic cost model
prices (edge reshards forward and backward, weight-gradient syncs, partial graph outputs), and
``measure`` (``tests/helpers/collective_counts.py``) counts what ``codegen.module.shard_module``
really runs under torch's ``CommDebugMode``, forward and backward apart. The counts by kind must
be equal, up to the differences listed in ``KNOWN``, each explained where it is defined.

Measured on real gloo processes: CommDebugMode's module tracker uses global module hooks, which
the ranks of the threaded process group trip over ("The Module hierarchy tracking is wrong").
One 4-process launch measures every plan: 4-device plans on the (2, 2) mesh, 2-device plans on a
1-d sub-mesh of each pair of ranks (start-up is the slow part on 2 cores).

How the two sides are made comparable:
- weight-gradient sync: the module's reducer sums gradients in buckets across nodes
  (``core.buckets``, c10d ``allreduce_``, counted as ``all_reduce`` like the fast moves' c10d calls); the
  prediction lists the same buckets, and the cost
  model prices each node's share (``test_bucket_prices_add_up_to_the_node_terms``);
- all-to-all: DTensor on a CPU process group runs it as an all-gather (and keeps its chunk), so
  the prediction is counted with ``backend="gloo"``. On NCCL the names agree as they are.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
from autopar.cost_models.analytic import AnalyticModel
from autopar.cost_models.collectives import Collectives, predicted_collectives

import autopar
from autopar.core.cluster import Cluster
from autopar.core.tables import Config
from tests.helpers.dist_utils import run_gloo
from tests.helpers.mlp import MLP, mlp_graph
from tests.helpers.models import PositionLookup
from tests.helpers.mlp import plans as mlp_plans
from tests.helpers.plans import data_parallel, sequence_parallel, sequence_split

# big enough that autopar's own plan splits on the cpu preset (a tiny one stays replicated)
GPT = dict(layers=1, batch=16, seq=32, width=128, heads=4, vocab=128)
CNN = dict(batch=4, channels=4, image=8, blocks=1)
MOE = dict(batch=4, seq=8, width=16, hidden=24, experts=4, layers=1)


def experts_split(graph, mesh, experts_axes=None) -> dict:
    """Data parallelism, and every ``moe_experts`` node's experts over ``experts_axes`` (default:
    the whole mesh), its tokens over the other axes."""
    assignment = data_parallel(graph, tuple(mesh.shape))
    every = tuple(range(len(mesh.shape)))
    ep = every if experts_axes is None else tuple(experts_axes)
    axes = {"experts": ep, "tokens": tuple(a for a in every if a not in ep)}
    for n in graph.nodes:
        if n.op == "moe_experts":
            assignment[n.name] = Config(tuple(math.prod(mesh.shape[a] for a in axes.get(d.name, ())) for d in n.dims),
                                        tuple(axes.get(d.name, ()) for d in n.dims))
    return assignment


def _case(model, inputs, graph, assignment, cluster: Cluster) -> dict:
    return dict(model=model, inputs=inputs, graph=graph, assignment=assignment,
                mesh=tuple(cluster.mesh().shape), cluster=cluster)


def build_cases() -> dict[int, dict[str, dict]]:
    """Plans per process count: hand-written MLP plans, and the planner's own for gpt."""
    cases: dict[int, dict[str, dict]] = {2: {}, 4: {}}
    model, inputs = autopar.zoo.get("mlp", **MLP)
    graph = mlp_graph(model, inputs)
    for world in (2, 4):
        cluster = Cluster.preset("cpu", devices=world)
        for name, assignment in mlp_plans(world).items():
            cases[world][f"mlp/{name}"] = _case(model, inputs, graph, assignment, cluster)
    model, inputs = autopar.zoo.get("cnn", **CNN)
    graph = autopar.trace(model, inputs)
    for world in (2, 4):
        cluster = Cluster.preset("cpu", devices=world)
        mesh = tuple(cluster.mesh().shape)
        cases[world]["cnn/data_parallel"] = _case(model, inputs, graph, data_parallel(graph, mesh),
                                                  cluster)
    model, inputs = PositionLookup(), PositionLookup.inputs(batch=8)
    graph = autopar.trace(model, inputs)
    for world in (2, 4):  # a weight view reading a constant (arange positions): its gradient in the bucket
        cluster = Cluster.preset("cpu", devices=world)
        cases[world]["poslookup/data_parallel"] = _case(model, inputs, graph,
                                                        data_parallel(graph, tuple(cluster.mesh().shape)), cluster)
    model, inputs = autopar.zoo.get("moe", **MOE)
    graph = autopar.trace(model, inputs)
    for world in (2, 4):  # experts split over every rank: their own all-to-alls (cost_models/experts.py)
        cluster = Cluster.preset("cpu", devices=world)
        cases[world]["moe/experts"] = _case(model, inputs, graph, experts_split(graph, cluster.mesh()), cluster)
    model, inputs = autopar.zoo.get("moe", **MOE, listed=True)
    graph = autopar.trace(model, inputs)
    for world in (2, 4):  # experts as a list of modules: each rank syncs its own experts' gradients only
        cluster = Cluster.preset("cpu", devices=world)
        mesh = cluster.mesh()
        cases[world]["moe/experts_listed"] = _case(model, inputs, graph, experts_split(graph, mesh), cluster)
        if world == 4:  # over the token axis too
            cases[world]["moe/experts_tokens_listed"] = _case(
                model, inputs, graph, experts_split(graph, mesh, (len(mesh.shape) - 1,)), cluster)
    model, inputs = autopar.zoo.get("gpt", **GPT)
    for world in (2, 4):
        plan = autopar.plan(model, inputs, Cluster.preset("cpu", devices=world), pipeline=False)
        for name, p in [("autopar", plan), *plan.baselines.items()]:
            cases[world][f"gpt/{name}"] = _case(model, inputs, plan.graph, p.assignment,
                                                Cluster(**p.cluster))
        # the sequence over the last mesh axis (the first one, if any, data parallel): attention by
        # query rows with K/V all-gathered; Megatron's sequence parallelism around its linears
        mesh = tuple(plan.mesh.shape)
        last, dp = (len(mesh) - 1,), tuple(range(len(mesh) - 1))
        cluster = Cluster(**plan.cluster)
        cases[world]["gpt/context"] = _case(model, inputs, plan.graph, sequence_split(plan.graph, mesh, last, dp),
                                            cluster)
        cases[world]["gpt/sequence_parallel"] = _case(model, inputs, plan.graph,
                                                      sequence_parallel(plan.graph, mesh, last, dp), cluster)
    return cases


def measure_rank(rank, world, cases):
    """Every plan's counts on this rank: 4-device plans on the (2, 2) mesh, 2-device plans on
    each pair of ranks ({0, 1} and {2, 3}: a 1-d sub-mesh each), so one launch serves both."""
    import torch
    from tests.helpers.collective_counts import measure
    from autopar.codegen.module import shard_module
    from torch.distributed.device_mesh import DeviceMesh

    grid = DeviceMesh("cpu", torch.arange(4).reshape(2, 2), mesh_dim_names=("pair", "rank"))
    out = {}
    for (size, name), c in cases.items():
        mesh = None if size == 4 else grid["rank"]
        found = measure(shard_module(c["model"], c["graph"], c["assignment"], c["mesh"],
                                     device_mesh=mesh), *c["inputs"])
        out[(size, name)] = (dict(found.forward), dict(found.backward))
    return out


@pytest.fixture(scope="module")
def cases():
    return build_cases()


def measure_all(cases) -> dict:
    flat = {(w, n): c for w, by_name in cases.items() for n, c in by_name.items()}
    per_rank = run_gloo(measure_rank, 4, flat)
    assert all(r == per_rank[0] for r in per_rank), per_rank
    return per_rank[0]


@pytest.fixture(scope="module")
def measured(cases):
    return measure_all(cases)


def predicted(case) -> Collectives:
    return predicted_collectives(case["graph"], case["assignment"], case["cluster"])


CASE_IDS = [(w, n) for w, names in (
    (2, ["mlp/data_parallel", "mlp/megatron", "mlp/reduction_split", "cnn/data_parallel",
         "gpt/autopar", "gpt/data_parallel", "gpt/expert", "poslookup/data_parallel", "moe/experts",
         "moe/experts_listed", "gpt/context", "gpt/sequence_parallel"]),
    (4, ["mlp/data_parallel", "mlp/dp_x_megatron", "mlp/reduction_split", "cnn/data_parallel",
         "gpt/autopar", "gpt/data_parallel", "gpt/expert", "poslookup/data_parallel", "moe/experts",
         "moe/experts_listed", "moe/experts_tokens_listed", "gpt/context", "gpt/sequence_parallel"])) for n in names]

# Where the module issues other collectives than the plan predicts, one entry per reshard:
# (phase, edge, change of counts issued - predicted), each to be flagged by ``Collectives.nested``
# and explained here. None left: reshards under a nested shard order (a tensor axis cut by two
# mesh axes, the lower one major) are priced as DTensor's greedy redistribute runs them
# (``comm.misaligned`` / ``comm._dtensor_steps``), e.g. (R, S(0)) -> (S(0), S(0)) as an all-gather
# over axis 1 then slices, (S(0), P) -> (S(1), S(0)) as an all-reduce over axis 1 then an
# all-to-all over axis 0, the gradient (S(1), P) -> (R, S(1)) as an all-reduce then an all-gather.
KNOWN: dict = {}


def batch_norm_stats(case) -> int:
    """Training batch norms with their batch split run with global statistics
    (``codegen/batchnorm.py``): two all-reduces (mean, variance) per node in the forward, priced
    by ``analytic.bn_stats`` (their backward is free: Replicate -> Partial). Counted here from the
    graph alone, to check the prediction lists them."""
    n = 0
    for node in case["graph"].nodes:
        cfg = case["assignment"].get(node.name)
        if node.op == "batch_norm" and cfg is not None and cfg.splits[0] > 1:
            n += 2
    return n


def expected(case, world, name, phase) -> dict:
    """The predicted counts of ``phase`` on gloo (batch-norm statistics included), plus the
    known, explained differences."""
    pred = predicted(case)
    want = Counter(pred.counts(phase, backend="gloo"))
    for ph, edge, delta in KNOWN.get((world, name), []):
        if ph == phase:
            for op, d in delta.items():
                want[op] += d
    return {k: v for k, v in want.items() if v}


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("world,name", CASE_IDS, ids=[f"{w}-{n}" for w, n in CASE_IDS])
def test_issued_collectives_are_the_predicted_ones(cases, measured, world, name):
    case = cases[world][name]
    fwd, bwd = measured[(world, name)]
    listing = "\n".join(predicted(case).lines())
    assert fwd == expected(case, world, name, "forward"), f"forward; predicted:\n{listing}"
    assert bwd == expected(case, world, name, "backward"), f"backward; predicted:\n{listing}"


def test_known_differences_are_nested_shard_reshards(cases):
    """Each known difference sits on a reshard the prediction flags, and the predicted steps of
    that reshard hold the collectives the difference takes away. None is listed today, so the
    check runs on two made here as well: one on mlp/reduction_split's flagged reshard passes, one
    on its head edge (no nested shard order there) is refused."""
    for key in sorted(KNOWN):
        _check_known(cases, key, KNOWN[key])
    key = (4, "mlp/reduction_split")
    pred = predicted(cases[key[0]][key[1]])
    assert pred.nested, "reduction_split on the (2, 2) mesh has a reshard under a nested shard order"
    phase, edge = pred.nested[0].phase, pred.nested[0].tensor
    op = next(it.op for it in pred.items if it.phase == phase and it.tensors == (edge,))
    _check_known(cases, key, [(phase, edge, {op: -1})])
    with pytest.raises(AssertionError, match="not flagged"):
        _check_known(cases, key, [("forward", "head:0 -> cross_entropy:0", {op: -1})])


def test_nested_reshards_are_covered(cases):
    """The plans still exercise reshards under a nested shard order (now priced as DTensor runs
    them), so the exact comparison above covers that pricing."""
    nested = predicted(cases[4]["mlp/reduction_split"]).nested
    assert {r.phase for r in nested} == {"forward", "backward"}


def _check_known(cases, key, differences):
    pred = predicted(cases[key[0]][key[1]])
    flagged = {(r.phase, r.tensor) for r in pred.nested}
    for phase, edge, delta in differences:
        assert (phase, edge) in flagged, f"{phase} {edge} not flagged; flagged: {sorted(flagged)}"
        steps = Counter(it.op for it in pred.items if it.phase == phase and it.tensors == (edge,))
        for op, d in delta.items():
            if d < 0:
                assert steps[op] >= -d, f"{phase} {edge}: predicted {dict(steps)}"


@pytest.mark.slow
@pytest.mark.dist
def test_cases_without_nested_reshards_need_no_exception(cases, measured):
    """Only plans with a flagged reshard may differ: every other plan issues exactly the
    predicted collectives, forward and backward, with no entry of ``KNOWN`` applied."""
    plain = 0
    for world, by_name in cases.items():
        for name, case in by_name.items():
            pred = predicted(case)
            if pred.nested:
                continue
            plain += 1
            assert (world, name) not in KNOWN
            for phase, found in zip(("forward", "backward"), measured[(world, name)]):
                want = {k: v for k, v in pred.counts(phase, backend="gloo").items() if v}
                assert found == want, f"{world}-{name} {phase}: issued {found}, predicted {want}"
    assert plain >= 10  # all but the plans with a nested shard order


def test_the_comparison_covers_every_kind(cases):
    """The plans exercise all four collectives the model prices (all-to-all included, which gloo
    runs as an all-gather) and the batch-norm statistics."""
    kinds = Counter()
    for by_name in cases.values():
        for case in by_name.values():
            pred = predicted(case)
            kinds.update(pred.counts("forward") + pred.counts("backward"))
    assert set(kinds) == {"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
                          "all_to_all_single"}
    assert batch_norm_stats(cases[2]["cnn/data_parallel"]) == 6
    for world in (2, 4):
        pred = predicted(cases[world]["cnn/data_parallel"])
        assert len(pred.of("bn-stats")) == batch_norm_stats(cases[world]["cnn/data_parallel"])


def test_the_list_is_what_the_model_prices(cases):
    """Itemized seconds add up to the analytic model's own terms: every edge's forward +
    backward to ``edge_cost``, every node's buckets to its weight-grad sync terms, partial
    outputs to ``output_cost``."""
    model = AnalyticModel()
    for by_name in cases.values():
        for name, case in by_name.items():
            graph, cluster, pred = case["graph"], case["cluster"], predicted(case)
            cfg = {n.name: case["assignment"].get(n.name) for n in graph.nodes}
            for n in graph.nodes:
                if cfg[n.name] is None:
                    cfg[n.name] = Config((1,) * len(n.dims), ((),) * len(n.dims))
            for e in graph.edges:
                edge = f"{e.src}:{e.src_output} -> {e.dst}:{e.dst_input}"
                mine = sum(it.collective.seconds for it in pred.items if it.tensors == (edge,))
                theirs = float(model.edge_cost(graph.node(e.src), e.src_output, graph.node(e.dst),
                                               e.dst_input, [cfg[e.src]], [cfg[e.dst]],
                                               cluster)[0, 0])
                theirs -= _lifted_sync(graph, e, case["assignment"], cluster, model)  # in a bucket
                assert mine == pytest.approx(theirs, rel=1e-9, abs=1e-15), (name, edge)
            for n in graph.nodes:
                terms = model.node_breakdown(n, cfg[n.name], cluster, text=False).terms
                stats = [t.seconds for t in terms if t.label.startswith("batch-norm statistics")]
                mine = sum(it.collective.seconds for it in pred.of("bn-stats", n.name))
                assert mine == pytest.approx(sum(stats)), (name, n.name)
                assert bool(stats) == bool(pred.of("bn-stats", n.name)), (name, n.name)
                # a mixture of experts' all-to-alls, a balanced causal attention's
                exchange = sum(t.seconds for t in terms if t.kind == "exchange")
                listed = pred.of("experts", n.name) + pred.of("attention", n.name)
                assert sum(it.collective.seconds for it in listed) == pytest.approx(exchange)
            for node_name, idx in graph.outputs:
                out = float(model.output_cost(graph.node(node_name), idx, [cfg[node_name]],
                                              cluster)[0])
                mine = sum(it.collective.seconds for it in pred.of("output", node_name))
                assert mine == pytest.approx(out), (name, node_name)


def test_bucket_prices_add_up_to_the_node_terms(cases):
    """The buckets' bandwidth terms are the nodes' sync bandwidth terms summed; their latency is
    at least the nodes' amortized shares and at most one latency per bucket more (its ring steps'
    and its call latency, where processes share cores)."""
    model = AnalyticModel()
    for by_name in cases.values():
        for name, case in by_name.items():
            graph, cluster, pred = case["graph"], case["cluster"], predicted(case)
            buckets = pred.of("grad-sync")
            priced = 0.0
            for n in graph.nodes:
                c = case["assignment"].get(n.name) or Config((1,) * len(n.dims), ((),) * len(n.dims))
                priced += sum(t.seconds for t in model.node_breakdown(n, c, cluster, text=False).terms
                              if t.kind == "sync" and not pred.of("bn-params", n.name))
            priced += sum(_lifted_sync(graph, e, case["assignment"], cluster, model) for e in graph.edges)
            issued = sum(it.collective.seconds for it in buckets)
            latency = sum(2 * (it.collective.p - 1) * it.collective.latency + it.collective.fixed for it in buckets)
            assert priced <= issued * (1 + 1e-9) + 1e-15, name
            assert issued <= priced + latency * (1 + 1e-9) + 1e-15, name


def _lifted_sync(graph, e, assignment, cluster, model) -> float:
    """The part of edge ``e``'s price that is its weight view's gradient summed in the weight's
    bucket (listed under grad-sync, not under the edge); 0 for other edges."""
    from autopar.cost_models.weight_view_sync import weight_view_sync

    from autopar.core.weight_views import WEIGHT_VIEW, lifted_grad_axes

    def cfg(n):
        return assignment.get(n.name) or Config((1,) * len(n.dims), ((),) * len(n.dims))
    src, dst, mesh = graph.node(e.src), graph.node(e.dst), cluster.mesh()
    if WEIGHT_VIEW not in src.attrs:
        return 0.0
    _, s_lay, d_lay, d_grad, _ = model._edge_layouts(src, e.src_output, dst, e.dst_input, [cfg(src)], [cfg(dst)], mesh)
    axes = lifted_grad_axes(src, s_lay[0], d_lay[0], d_grad[0])
    return weight_view_sync(src, axes, mesh, cluster)[0] if axes else 0.0


def test_data_parallel_gradients_go_in_one_bucket():
    """Data-parallel MLP: 3 linears, weight and bias each, 6 tensors of a few KiB: one bucket,
    filled from the last layer back."""
    model, inputs = autopar.zoo.get("mlp", **MLP)
    graph = autopar.trace(model, inputs)
    cluster = Cluster.preset("cpu", devices=2)
    pred = predicted_collectives(graph, data_parallel(graph, tuple(cluster.mesh().shape)), cluster)
    (bucket,) = pred.of("grad-sync")
    assert pred.counts("backward") == {"all_reduce": 1}
    assert bucket.tensors[:2] == ("param:head.bias", "param:head.weight")
    assert len(bucket.tensors) == 6
