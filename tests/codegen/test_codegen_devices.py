"""Tensors a forward makes are made on the rank's device, whatever device the trace saw.

Causal masks built three ways (``torch.ones(t, t, device=x.device)``, sizes from ``x.size(1)``
with no device, a registered buffer sliced to the sequence), positions from ``torch.arange`` and
a scale from ``torch.tensor``: each model trains 3 steps on 2 gloo processes and must match one
device (loss, gradients, parameters, buffers), from the torch.fx graph (traced on meta tensors)
and from a torch.export graph of the model on the meta device (which records ``device=meta`` in
its factories). The existing factory tests made their tensors without naming a device, so the
trace's device never reached the program.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import fx

import autopar
from autopar.codegen.devices import makes_on_device
from tests.helpers.case_runs import case_ids, cases_fixture, check_case

VOCAB, WIDTH, SEQ, BATCH = 24, 16, 8, 4


class _Attention(nn.Module):
    """One causal self-attention head and a vocabulary head; ``mask(x, t)`` says where the
    scores are kept."""

    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQ, WIDTH)
        self.qkv, self.head = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, VOCAB)

    def forward(self, x, y):
        t = x.size(1)
        h = self.tok(x) + self.pos(torch.arange(t, device=x.device))
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        scores = (q @ k.transpose(-2, -1)) * torch.tensor(WIDTH ** -0.5)
        scores = scores.masked_fill(self.mask(x, t) == 0, float("-inf"))
        h = h + scores.softmax(-1) @ v
        return F.cross_entropy(self.head(h).flatten(0, 1), y.flatten())


class DeviceOfInput(_Attention):
    def mask(self, x, t):
        return torch.tril(torch.ones(t, t, device=x.device))


class SizeOfInput(_Attention):
    def mask(self, x, t):
        return torch.ones(x.size(1), x.size(1)).tril() + torch.full((t, t), 0.0) + torch.empty(0, t).sum()


class Buffer(_Attention):
    def __init__(self):
        super().__init__()
        self.register_buffer("causal", torch.tril(torch.ones(SEQ, SEQ)))

    def mask(self, x, t):
        return self.causal[:t, :t]


MODELS = {"device_of_input": DeviceOfInput, "size_of_input": SizeOfInput, "buffer": Buffer}
CASES = [(m, f, p) for m in sorted(MODELS) for f in ("fx", "export") for p in ("data_parallel", "split_everything")]
CASES += [(m, "fx", "searched") for m in sorted(MODELS)]  # autopar.compile, as a user calls it


def _model(name: str):
    torch.manual_seed(0)
    return MODELS[name](), (torch.randint(0, VOCAB, (BATCH, SEQ)), torch.randint(0, VOCAB, (BATCH, SEQ)))


def _graph(model, inputs, frontend: str):
    """fx traces on meta tensors anyway; export is handed the model and inputs on meta where the
    model makes its tensors on its input's device (one that makes them on the default device
    runs on the CPU only: it is exported there)."""
    if frontend == "fx":
        return autopar.trace(model, inputs, frontend="fx")
    if isinstance(model, SizeOfInput):
        return autopar.trace(model, inputs, frontend="export")
    return autopar.trace(copy.deepcopy(model).to("meta"), tuple(t.to("meta") for t in inputs), frontend="export")


trained = cases_fixture(CASES, _model, _graph)


@pytest.mark.dist
@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_made_tensors_are_made_on_the_ranks_device_and_train_like_one_device(trained, case):
    check_case(trained, case)


def test_a_factory_without_a_device_is_given_the_ranks_and_traced_devices_become_it():
    """The CPU is torch's default device, so the numerics above cannot see a factory that names
    no device: on a GPU rank it would make its tensor on the CPU."""
    graph = autopar.trace(SizeOfInput(), _model("size_of_input")[1], frontend="fx")
    rank = torch.device("cuda", 3)
    made = [n for n in graph.fx_graph.graph.nodes if n.op == "call_function" and "device" not in n.kwargs
            and getattr(n.target, "__name__", "") in ("ones", "full", "empty")]
    assert len(made) == 3
    for n in made:  # the program passes the traced sizes, as here
        _, kwargs = makes_on_device(n, *fx.node.map_arg((n.args, n.kwargs), lambda a: SEQ), rank)
        assert kwargs["device"] == rank, n.format_node()
    meta = torch.device("meta")
    exported = _graph(*_model("device_of_input"), "export").fx_graph.graph
    ones = [n for n in exported.nodes if n.op == "call_function" and "ones" in str(n.target)]
    assert ones and all(n.kwargs.get("device") == meta for n in ones)
    assert all(makes_on_device(n, n.args, n.kwargs, rank)[1]["device"] == rank for n in ones)
