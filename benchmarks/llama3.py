"""Llama 3 8B and 70B (Hugging Face ``LlamaForCausalLM`` from its published configuration) as
``autopar`` MODEL factories: ``benchmarks/llama3.py:llama3_8b_meta`` and so on.

``*_meta``: the model at full size on the meta device (shapes, no values): what ``autopar plan``
takes. ``llama3_8b``: its weights initialised in host memory (about 32 GB in fp32), what
``autopar measure`` builds a rank's shards from. Called as ``CausalLM(input_ids, labels) -> loss``
(``benchmarks/llama_small.py``), at sequence length 8,192 and one sequence per 8 GPUs' worth
of batch: 64 sequences for the 8B (64 GPUs), 1,024 for the 70B (1,024 GPUs).
"""

from __future__ import annotations

import torch

from benchmarks.llama_small import CausalLM

CONFIGS = {  # Meta's published Llama 3 configurations
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8),
    "70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8),
}
SEQ, VOCAB = 8192, 128256
BATCH = {"8b": 64, "70b": 1024}


def llama3(size: str, device: str = "meta", batch: int | None = None, seq: int = SEQ):
    import transformers

    config = transformers.LlamaConfig(**CONFIGS[size], vocab_size=VOCAB, max_position_embeddings=seq,
                                      rope_theta=500000.0, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = CausalLM(transformers.LlamaForCausalLM(config).train())
    ids = torch.randint(0, VOCAB, (batch or BATCH[size], seq))
    return model, (ids, ids.clone())


def llama3_8b_meta():
    return llama3("8b")


def llama3_8b():
    return llama3("8b", device="cpu")


def llama3_70b_meta():
    return llama3("70b")


def parameters(size: str) -> int:
    """The model's parameter count, from its configuration (no model built)."""
    c = CONFIGS[size]
    h, f, layers, heads, kv = (c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"],
                               c["num_attention_heads"], c["num_key_value_heads"])
    attn = h * h * 2 + 2 * h * (h // heads) * kv
    return 2 * VOCAB * h + layers * (attn + 3 * h * f + 2 * h) + h
