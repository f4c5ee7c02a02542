"""Pointwise recomputation (op-level selective activation checkpointing, ``core/selective.py``):
inside each repeated block the matmuls' and fused attentions' outputs are kept and every other op
runs again in the backward. Checked against torch itself running a zoo Llama's blocks under the
wrapping codegen emits (``codegen/selective.py``): the bytes of the storages alive after the
forward, the ops run again in the backward (a dispatch mode) and their FLOPs (``FlopCounterMode``);
and chosen, on both search paths, where it is the fastest plan that fits (brute force over the
recomputations)."""

from __future__ import annotations

import gc
from collections import Counter

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

import autopar
from autopar.codegen.selective import pointwise_checkpoint
from autopar.core.blocks import apply_training, repeated_blocks
from autopar.core.cluster import Cluster
from autopar.core.margin import device_memory_for
from autopar.core.strategy import Degrees, TrainingOptions
from autopar.cost_models.analytic import AnalyticModel
from autopar.cost_models.tables import build_tables
from autopar.planning import hierarchical as H
from autopar.planning.baselines import data_parallel_choice
from autopar.planning.degrees import Pin, recompute_value
from autopar.planning.every import searched_recomputes
from autopar.planning.step_bounds import rerun_flops
from autopar.planning.step_price import Candidate
from autopar.search.dp import dp
from tests.cost_models.test_memory import modelled_activations

POINTWISE = TrainingOptions(recompute="pointwise")
SMALL = dict(batch=2, seq=16, width=64, heads=4, kv_heads=2, ffn=96, layers=2, vocab=128)


class _Created(TorchDispatchMode):
    """Every storage an op creates (weakly held) and every op run, while active."""

    def __init__(self):
        super().__init__()
        self.storages: dict[int, tuple[StorageWeakRef, int]] = {}
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops[func] += 1
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                self.storages[st.data_ptr()] = (StorageWeakRef(st), st.nbytes())
        return out


def kept_bytes(model, *inputs) -> tuple[int, torch.Tensor]:
    """(bytes held for the backward after ``model(*inputs)``, the loss): the distinct storages
    created during the forward still alive after it (what checkpointing caches and keeps as the
    blocks' inputs included), with those autograd's saved-tensor hooks see (the inputs); the
    parameters, buffers and the loss itself left out."""
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    mode = _Created()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), mode:
        loss = model(*inputs)
    gc.collect()
    alive = {p: b for p, (ref, b) in mode.storages.items() if not ref.expired()}
    alive.update(saved)
    state = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers(), loss]}
    return sum(b for p, b in alive.items() if p not in state), loss


def pointwise_blocks(model) -> None:
    """Each block's forward under the selective checkpoint codegen's ``Recomputed`` runs."""
    for block in model.blocks:
        block.forward = lambda x, f=block.forward: pointwise_checkpoint(f, x)


@pytest.mark.parametrize("attention", ["sdpa", "manual"])
def test_pointwise_recompute_keeps_what_selective_checkpointing_keeps(attention):
    """A zoo Llama (eager RMSNorms, rotary products, grouped-query attention, SwiGLU): under
    selective checkpointing the blocks keep their linears' outputs, the fused kernel's output and
    log-sum-exp (written out: both attention matmuls' outputs, the scores among them) and their
    inputs; the memory model's activations are torch's within 0.1% (the loss's 4-byte weight),
    as they are without recomputation, and well below them."""
    model, (idx, labels) = autopar.zoo.get("llama", attention=attention, **SMALL)
    g = autopar.trace(model, (idx, labels))
    plain, _ = kept_bytes(model, idx, labels)
    pointwise_blocks(model)
    kept, loss = kept_bytes(model, idx, labels)
    loss.backward()
    assert modelled_activations(apply_training(g, TrainingOptions())) == pytest.approx(plain, rel=1e-3)
    assert modelled_activations(apply_training(g, POINTWISE)) == pytest.approx(kept, rel=1e-3)
    assert kept < 0.75 * plain


def test_pointwise_recompute_prices_the_ops_torch_runs_again():
    """The backward under selective checkpointing runs no matmul or attention again (torch's FLOP
    counter: the same FLOPs as without recomputation; every block's forward FLOPs more with full
    recomputation), and re-runs the blocks' pointwise ops: the priced re-run (each non-kept node
    of a block forward again) is, op for op, what a dispatch mode sees run again, but for each
    block's last residual add, which torch skips (its recomputation stops once every saved tensor
    is back). The step grows by exactly those nodes' forward time."""
    model, (idx, labels) = autopar.zoo.get("llama", **SMALL)
    g = autopar.trace(model, (idx, labels))

    def backward():
        loss = model(idx, labels)
        mode = _Created()
        with mode, FlopCounterMode(display=False) as fc:
            loss.backward()
        return mode.ops, fc.get_total_flops()

    plain_ops, plain_flops = backward()
    forward = sum(n.flops for b in repeated_blocks(g) for n in (g.nodes[i] for i in b.nodes))
    pointwise_blocks(model)
    ops, flops = backward()
    search = H.Search(g, Cluster(devices=1), "fp32", "adam", "train", 1e12, lambda t, g=None: dp(t))
    candidate = Candidate(Degrees((1,), (1,), (1,)), 1, 0, False, "pointwise")
    assert flops == plain_flops and rerun_flops(candidate, search.totals) == 0.0
    full = Candidate(Degrees((1,), (1,), (1,)), 1, 0, False, True)
    assert rerun_flops(full, search.totals) == forward > 0

    again = ops - plain_ops  # what the backward runs beyond its own ops
    graph = apply_training(g, POINTWISE)
    rerun = [n for n in graph.nodes if n.attrs["train"].recompute and not n.attrs["train"].kept]
    priced = Counter(n.attrs.get("fn") or n.op for n in rerun)
    aten = torch.ops.aten
    measured = {"pow": aten.pow.Tensor_Scalar, "mean": aten.mean.dim, "rsqrt": aten.rsqrt.default,
                "neg": aten.neg.default, "cat": aten.cat.default, "silu": aten.silu.default,
                "mul": aten.mul.Tensor, "add": aten.add.Tensor}
    for fn, op in measured.items():
        skipped = SMALL["layers"] if fn == "add" else 0
        assert priced[fn] - skipped == again[op] > 0, fn
    assert not any(n.op in ("linear", "sdpa") for n in rerun)
    for kept_op in (aten.mm.default, aten._scaled_dot_product_flash_attention_for_cpu.default):
        assert again[kept_op] == 0

    cluster, cost = Cluster.preset("8xA100"), AnalyticModel(optimizer="adam")
    plain = build_tables(apply_training(g, TrainingOptions()), cluster, cost, space="mesh")
    pw = build_tables(graph, cluster, cost, space="mesh")
    choice = data_parallel_choice(g, plain)
    inference = build_tables(g, cluster, AnalyticModel(), space="mesh", mode="inference")
    by_name = {n.name: i for i, n in enumerate(g.nodes)}
    hand = sum(float(inference.node_cost[by_name[n.name]][choice[by_name[n.name]]]) for n in rerun)
    assert pw.total(choice) - plain.total(choice) == pytest.approx(hand, rel=1e-9)


@pytest.fixture(scope="module")
def llama():
    """Llama blocks wide enough that the matmuls set the step (their re-run is what full and
    every-k recomputation pay), batch enough that the activations are a third of the memory."""
    model, inputs = autopar.zoo.get("llama", batch=64, seq=1024, width=4096, heads=32, kv_heads=8, ffn=11008,
                                    layers=4, vocab=4096, device="meta")
    return model, inputs, autopar.trace(model, inputs)


def test_the_hierarchical_search_picks_pointwise_where_none_does_not_fit_and_the_rest_is_slower(llama):
    """Data parallelism over 8 A100s: with the memory of pointwise recomputation's plan, none and
    every 4th/2nd block do not fit (every k-th holds a recomputed block's activations while its
    backward runs) and every block fits but runs all matmuls again; the search over what
    ``recompute="auto"`` weighs picks the fastest that fits of a brute force over each."""
    _, _, g = llama
    cluster, pin = Cluster.preset("8xA100"), Pin(tensor=1, pipeline=1, microbatch=8)
    probe = H.Search(g, cluster, "bf16", "adam", "train", 1e15, lambda t, g=None: dp(t))
    modes = searched_recomputes("auto", 4, False)
    assert "pointwise" in modes
    cap = probe.price(Candidate(Degrees((1,), (1,), (8,)), 1, 0, False, "pointwise")).memory
    s = H.Search(g, cluster, "bf16", "adam", "train", cap, lambda t, g=None: dp(t))
    each = {rc: s.best(pin, (0,), (rc,))[0] for rc in modes}
    fitting = {rc: x.cost for rc, x in each.items() if x is not None and x.fits}
    assert False not in fitting and 2 not in fitting and True in fitting
    best, _, _, _ = s.best(pin, (0,), modes)
    assert best.candidate.recompute == min(fitting, key=fitting.get) == "pointwise"
    assert "pointwise recompute (matmul and attention outputs kept)" in best.candidate.describe()


def test_the_flat_search_picks_pointwise_where_none_does_not_fit_and_the_rest_is_slower(llama):
    """The same on the flat path, on one A100 (on more, a plan without recomputation finds a
    layout that fits): with the memory of the pointwise plan, ``recompute="auto"`` plans what
    the fastest fitting of the plans pinned to each recomputation is; the plan records every
    block as recomputed, which codegen wraps in selective checkpointing."""
    from autopar.codegen.training import program_training

    model, inputs, g = llama
    cluster = Cluster.preset("8xA100", devices=1)
    kw = dict(graph=g, pipeline=False, baselines=False, zero=0, accumulate=1, precision="bf16", hierarchical=False)
    cap = device_memory_for(autopar.plan(model, inputs, cluster, recompute="pointwise", **kw).memory_per_device)
    each = {}
    for rc in (False, "attention", "pointwise", 4, 2, True):
        try:
            each[rc] = autopar.plan(model, inputs, cluster, recompute=rc, memory_capacity=cap, **kw).cost
        except autopar.InfeasibleError:
            pass
    assert False not in each and True in each
    auto = autopar.plan(model, inputs, cluster, recompute="auto", memory_capacity=cap, **kw)
    assert auto.strategy.options.recompute == min(each, key=each.get) == "pointwise"
    assert auto.cost == pytest.approx(each["pointwise"], rel=1e-9)
    assert auto.strategy.recompute == tuple(b.path for b in repeated_blocks(g))
    training = program_training(g, auto.strategy)
    assert training.pointwise and training.recompute == auto.strategy.recompute
    assert autopar.Plan.from_json(auto.to_json()).strategy.options.recompute == "pointwise"


def test_pointwise_is_written_as_a_pin_and_a_flag():
    assert recompute_value("pointwise") == "pointwise" and recompute_value(" Pointwise ") == "pointwise"
    assert autopar.planning.degrees.parse_pin("tensor=2,recompute=pointwise").recompute == "pointwise"
    with pytest.raises(ValueError, match="pointwise"):
        recompute_value("pointwize")
    with pytest.raises(ValueError, match="pointwise"):
        TrainingOptions(recompute="pointwize")
