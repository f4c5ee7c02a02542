"""Every k-th block recomputed on the hierarchical path (planning/every.py): blocks 0, k, 2k, ...
keep only their inputs and run their forward again, the others keep all their activations.
Checked against a hand count from what autograd saves per block (``saved_tensors_hooks``) and
the blocks' forward FLOPs (``FlopCounterMode``), and chosen where it is the fastest that fits."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import autopar
from autopar.core.cluster import Cluster
from autopar.core.strategy import Degrees
from autopar.planning import hierarchical as H
from autopar.planning.degrees import Pin, recompute_value
from autopar.planning.every import every_options
from autopar.planning.step_bounds import rerun_flops
from autopar.planning.step_price import Candidate
from autopar.search.dp import dp

B, W, HID, L, D = 64, 64, 256, 4, 8  # batch, width, hidden, blocks, data-parallel devices
BIG = 4096  # the batch where compute sets the step
ACTS = "activations in flight"
TINY = 64  # bytes: the loss's saved scalars (a block differs by 16 KiB)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(W, HID), nn.Linear(HID, W)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self, blocks=L):
        super().__init__()
        self.inp = nn.Linear(W, W)
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.head = nn.Linear(W, 16)

    def forward(self, x, labels):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return F.cross_entropy(self.head(x), labels)


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    model = Net()
    inputs = (torch.randn(B, W), torch.randint(0, 16, (B,)))
    g = autopar.trace(model, inputs)
    return model, inputs, g, H.Search(g, Cluster(devices=D), "fp32", "adam", "train", 1e12, lambda t, g=None: dp(t))


def saved_bytes(model, fn) -> int:
    """Bytes of the distinct tensors autograd saves while ``fn`` runs (parameters left out)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def priced(search, rc):
    """The data-parallel candidate over all devices, one microbatch, ``rc`` recomputation."""
    return search.price(Candidate(Degrees((1,), (1,), (D,)), 1, 0, False, rc))


def test_every_kth_block_is_priced_as_a_hand_count_of_saved_tensors_and_forward_flops(net):
    """Per device (a microbatch of B/D rows): the prologue and head keep what they keep, a
    block not recomputed all its saved tensors, a recomputed one only its input; while a
    recomputed block's backward runs it holds its saved tensors again (the transient). The
    step runs the recomputed blocks' forward FLOPs again, and its compute grows by that share
    of what recomputing every block adds."""
    model, (x, y), _, search = net
    b = B // D
    xb, yb = x[:b].clone(), y[:b].clone()  # their own storage: a slice would count all of x
    whole = saved_bytes(model, lambda: model(xb, yb))
    inner = model.inp(xb).detach().requires_grad_(True)
    block = saved_bytes(model, lambda: model.blocks[1](inner))
    kept = inner.nbytes  # a recomputed block's input
    ends = whole - L * block
    with FlopCounterMode(display=False) as fc:
        model.blocks[0](model.inp(x))
    forward = fc.get_total_flops() - 2 * B * W * W  # one block's, at the whole batch
    plain, full = priced(search, False), priced(search, True)
    for k in (2, 4):
        recomputed = len(range(0, L, k))
        pr = priced(search, k)
        assert pr.memory_terms[ACTS] == pytest.approx(ends + (L - recomputed) * block + recomputed * kept, abs=TINY)
        assert pr.memory_terms["transient (recomputed block, gathered ZeRO-3 parameters)"] == pytest.approx(
            block - kept, rel=1e-9)
        c = pr.candidate
        assert rerun_flops(c, search.totals) == pytest.approx(recomputed * forward, rel=0.01)
        grow = pr.terms["compute"] - plain.terms["compute"]
        assert grow == pytest.approx(recomputed / L * (full.terms["compute"] - plain.terms["compute"]), rel=1e-9)
        assert f"recompute every {k} blocks" in c.describe()
    assert plain.memory_terms[ACTS] == pytest.approx(whole, abs=TINY)
    assert full.memory_terms[ACTS] == pytest.approx(ends + L * kept, abs=TINY)


def test_every_second_block_is_chosen_where_none_does_not_fit_and_every_block_is_slower():
    """Eight blocks, a batch large enough that compute, not the sync, sets the step: with the
    memory of the every-2nd plan, the search over none, every 4th, every 2nd and every block
    picks every 2nd; the plan records blocks 0, 2, 4, 6 as checkpointed, which is what codegen
    wraps."""
    from autopar.codegen.training import program_training

    torch.manual_seed(0)
    model = Net(blocks=8)
    inputs = (torch.randn(BIG, W), torch.randint(0, 16, (BIG,)))
    g = autopar.trace(model, inputs)
    assert every_options(L) == (2,) and every_options(8) == (2, 4) and every_options(6) == (2,)
    probe = H.Search(g, Cluster(devices=D), "fp32", "adam", "train", 1e12, lambda t, g=None: dp(t))
    each = {rc: priced(probe, rc) for rc in (False, 4, 2, True)}
    assert each[False].memory > each[4].memory > each[2].memory > each[True].memory
    cap = each[2].memory
    s = H.Search(g, Cluster(devices=D), "fp32", "adam", "train", cap, lambda t, g=None: dp(t))
    best, _, _, _ = s.best(Pin(tensor=1, pipeline=1, microbatch=BIG // D), (0,), (False, 4, 2, True))
    assert best.candidate.recompute == 2 and each[2].cost < each[True].cost
    plan = autopar.plan(model, inputs, Cluster(devices=D), graph=g, hierarchical=True, precision="fp32", zero=0,
                        recompute=2, pin=f"tensor=1,pipeline=1,microbatch={BIG // D}", baselines=False)
    st = plan.strategy
    assert st.options.recompute is True and st.options.every == 2 and "recompute every 2 blocks" in st.options.describe()
    assert st.recompute == ("blocks.0", "blocks.2", "blocks.4", "blocks.6")
    assert program_training(g, st).recompute == st.recompute


def test_recompute_values_parse_and_refuse_in_one_line():
    assert [recompute_value(v) for v in ("none", "full", "attention", "every-2", "4", "1", "off")] == \
        [False, True, "attention", 2, 4, True, False]
    with pytest.raises(ValueError, match="every-K"):
        recompute_value("sometimes")
    with pytest.raises(ValueError, match="every-K"):
        autopar.planning.degrees.parse_pin("tensor=2,recompute=every-x")
