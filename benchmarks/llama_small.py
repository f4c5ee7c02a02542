"""A small Hugging Face Llama for ``autopar measure`` on a CPU: ``benchmarks/llama_small.py:factory``.

``transformers.LlamaForCausalLM`` from a ``LlamaConfig`` (2 layers, hidden 256, 8 heads of which 4
key/value heads, MLP 688, vocabulary 4096; 64 sequences of 128 tokens), called with ``input_ids``
and ``labels`` positionally through ``CausalLM``, which returns the model's own loss: ``measure``
takes positional inputs.
"""

from __future__ import annotations

import torch
from torch import nn

SIZES = dict(layers=2, hidden=256, heads=8, kv_heads=4, mlp=688, vocab=4096, seq=128, batch=64)


class CausalLM(nn.Module):
    """``model(input_ids, labels) -> loss`` for a Hugging Face causal LM (its parameters as the model's)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, labels):
        return self.model(input_ids=input_ids, labels=labels, use_cache=False).loss


def factory(**sizes):
    import transformers

    s = {**SIZES, **sizes}
    config = transformers.LlamaConfig(
        hidden_size=s["hidden"], intermediate_size=s["mlp"], num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"], vocab_size=s["vocab"],
        max_position_embeddings=s["seq"], tie_word_embeddings=False)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = CausalLM(transformers.LlamaForCausalLM(config).train())
    ids = torch.randint(0, s["vocab"], (s["batch"], s["seq"]))
    return model, (ids, ids.clone())
