"""Random plans from the search's own config space (``search.space.mesh_configs``) run correctly.

Any config the search may pick for any node must give the single-device numerics, whatever its
neighbours picked: this samples whole assignments at random (seeded) for the zoo models and for
``Odd``, a model made of the ops the zoo lacks (split, partial slices, cat, sum/mean, einsum,
permute/reshape, softmax, a bare parameter matmul), and PaSE's models at toy sizes: the RNN LM (an
LSTM whose hidden-unit cut runs whole), the einsum Transformer (stack/unbind), AlexNet; meshes of
2, (2, 2) and (2, 3) ranks. One forward, backward and AdamW step each.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autopar
from autopar.core.tables import Mesh
from autopar.core.space import mesh_configs
from tests.helpers.dist_utils import run_threaded
from tests.helpers.numerics import check_rank, reference_run


class Odd(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 24)
        self.ln = nn.LayerNorm(12)
        self.proj = nn.Parameter(torch.randn(12, 6) / 4)

    def forward(self, x, labels):
        a, b = self.fc(x).split(12, dim=1)
        y = (a.sigmoid() * b)[:, :10]  # a partial slice: its output dim indexes no input axis
        y = torch.cat([y, y.mean(dim=1, keepdim=True), y.sum(dim=1, keepdim=True)], dim=1)
        y = self.ln(y)
        z = torch.einsum("bi,bj->bij", y, y.sigmoid()).sum(dim=2)
        z = z.view(8, 3, 4).permute(0, 2, 1).reshape(8, 12)
        return F.cross_entropy(torch.softmax(z, dim=-1) @ self.proj, labels)


def build(name: str):
    torch.manual_seed(0)
    if name == "odd":
        return Odd(), (torch.randn(8, 8), torch.randint(0, 6, (8,)))
    sizes = {"gpt": dict(layers=1, batch=4, seq=8, width=16, heads=2, vocab=32),
             "cnn": dict(blocks=1, batch=4, channels=4, image=8),
             "rnnlm": dict(batch=4, seq=6, vocab=32, units=8, layers=2),
             "transformer": dict(batch=4, seq=8, vocab=32, width=16, heads=2, hidden=32, layers=1),
             "alexnet": dict(batch=4, image=67, fc=32, classes=8),
             "gpt-6": dict(layers=1, batch=6, seq=6, width=12, heads=6, vocab=36)}[name]
    return autopar.zoo.get(name.split("-")[0], **sizes)


CASES = [("odd", 2, 0), ("odd", 4, 1), ("gpt", 2, 5), ("gpt", 4, 3), ("cnn", 4, 7),
         ("rnnlm", 2, 3), ("rnnlm", 4, 6),  # LSTM cut on hidden units (and batch, with 4)
         ("transformer", 2, 0), ("alexnet", 2, 2),
         ("gpt-6", 6, 0)]  # a (2, 3) mesh: an axis of 3, where halves are not exact in binary
MESHES = {2: (2,), 4: (2, 2), 6: (2, 3)}


@pytest.mark.parametrize("name,world,seed", CASES, ids=[f"{n}-{w}-seed{s}" for n, w, s in CASES])
def test_random_plan_matches_single_device(name, world, seed):
    model, inputs = build(name)
    graph = autopar.trace(model, inputs)
    mesh = MESHES[world]
    rnd = random.Random(seed)
    plan = {n.name: rnd.choice(mesh_configs(n, Mesh(mesh))) for n in graph.nodes}
    assert sum(c.devices > 1 for c in plan.values()) >= len(plan) // 3  # mostly split nodes
    run_threaded(check_rank, world, model, inputs, graph, plan, mesh,
                 reference_run(model, inputs, steps=1), 1)
