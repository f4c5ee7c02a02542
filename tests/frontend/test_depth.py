"""A deep model's graph built from a trace of four of its layers equals the trace of the whole model.

Compared field by field (``Graph.__eq__``: every node's name, op, module, inputs, parameters,
shapes, FLOPs, bytes and attributes, and the outputs) with ``autopar.trace`` of the full model,
on the decoder families people train, built on meta with 7 layers (the window is 4).
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn

import autopar
from autopar.frontend import depth

LAYERS = 7


def _decoder(family: str):
    import transformers as T

    from tests.helpers.hf_models import transformers_quiet

    transformers_quiet()
    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)
    if family == "gpt2":
        cfg, cls = T.GPT2Config(n_layer=LAYERS, n_embd=64, n_head=4, vocab_size=256, n_positions=64,
                                bos_token_id=0, eos_token_id=0), T.GPT2LMHeadModel
    elif family == "gemma":
        cfg, cls = T.GemmaConfig(head_dim=16, **common), T.GemmaForCausalLM
    elif family == "qwen3":
        cfg, cls = T.Qwen3Config(head_dim=16, **common), T.Qwen3ForCausalLM
    else:
        cfg, cls = {"llama": T.LlamaConfig, "mistral": T.MistralConfig}[family](**common), \
            {"llama": T.LlamaForCausalLM, "mistral": T.MistralForCausalLM}[family]
    with torch.device("meta"):
        model = cls(cfg)
        ids = torch.zeros(2, 16, dtype=torch.long)
    return model, dict(input_ids=ids, labels=ids)


def _lifted_unnumbered(graph):
    """The graph with torch.export's lifted constants' numbers dropped (see the Mistral case)."""
    import dataclasses

    strip = lambda s: re.sub(r"lifted_tensor_\d+", "lifted_tensor", s)  # noqa: E731
    nodes = [dataclasses.replace(n, params=tuple(dataclasses.replace(p, source=strip(p.source)) for p in n.params),
                                 attrs={k: strip(v) if isinstance(v, str) else v for k, v in n.attrs.items()})
             for n in graph.nodes]
    return dataclasses.replace(graph, nodes=nodes)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma"])
def test_deepened_graph_equals_the_full_trace(family):
    model, inputs = _decoder(family)
    full = autopar.trace(model, inputs)
    short = depth.trace_for_planning(model, inputs)
    assert short.fx_graph is None, "built from the window, not traced whole"
    assert short.source is None, "compile must trace the model itself"
    assert len(short.nodes) == len(full.nodes)
    assert short == full


def test_mistral_equal_but_for_the_numbers_of_exports_lifted_constants():
    # Mistral's empty cache tensors are numbered by torch.export in an order that depends on the
    # depth (every layer's come after a per-layer prologue): zero-size constants; the rest is equal.
    model, inputs = _decoder("mistral")
    full = autopar.trace(model, inputs)
    short = depth.trace_for_planning(model, inputs)
    assert short.fx_graph is None
    assert _lifted_unnumbered(short) == _lifted_unnumbered(full)
    assert len({p.source for n in short.nodes for p in n.params}) == len({p.source for n in full.nodes
                                                                         for p in n.params})


class _Layer(nn.Module):
    def __init__(self, width: int, scale: float = 1.0):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.scale = scale

    def forward(self, x):
        return torch.relu(self.lin(x)) * self.scale


class _Indexed(nn.Module):
    """Runs its layers by a count of its own: cut to four layers, it fails, so it is traced whole
    (its control flow on a shape makes it an export model: fx would trace it whole anyway)."""

    def __init__(self, n: int = 6, scales=None):
        super().__init__()
        self.n = n
        self.layers = nn.ModuleList(_Layer(8, (scales or [1.0] * n)[i]) for i in range(n))

    def forward(self, x):
        if x.shape[0] > 2:  # control flow on a shape: torch.fx cannot trace it, torch.export can
            x = x * 2
        for i in range(self.n):
            x = self.layers[i](x)
        return x.sum()


def test_a_model_whose_cut_does_not_run_is_traced_whole():
    model = _Indexed()
    x = torch.randn(4, 8)
    graph = depth.trace_for_planning(model, (x,))
    assert graph.fx_graph is not None and len(model.layers) == 6, "traced whole, the model left as it was"
    assert graph.frontend == "export"
    assert graph == autopar.trace(model, (x,))


def test_a_model_fx_traces_is_traced_whole():
    class Plain(_Indexed):
        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x.sum()

    graph = depth.trace_for_planning(Plain(), (torch.randn(4, 8),))
    assert graph.frontend == "fx" and graph.fx_graph is not None


def test_layers_that_differ_are_not_repeated():
    model = _Indexed(scales=[1.0, 1.0, 2.0, 1.0, 1.0, 1.0])
    assert depth.repeated_layers(model) is None
    assert depth.repeated_layers(_Indexed()) is not None


def test_step():
    assert depth._step("linear_7", "linear_14", 2) == "linear_28"
    assert depth._step("linear", "linear_7", 1) == "linear_14"
    assert depth._step("model.layers.1.mlp.fc1", "model.layers.2.mlp.fc1", 3) == "model.layers.5.mlp.fc1"
    assert depth._step("a.x", "b.x", 1) is None
