"""Small Hugging Face mixtures of experts built from their configs (no download): Mixtral (8
routed experts in the real model, 4 here, top-2) and Qwen2-MoE (routed experts beside a gated
shared expert). Float64 runs need transformers' ``batched_mm`` experts (its default ``grouped_mm``
has no float64 kernel on CPU); ``implementation`` picks another.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # configs only: never touch the network

import torch  # noqa: E402

NAMES = ("mixtral", "qwen2_moe")
VOCAB, SEQ = 128, 8


def config(name: str, experts: int = 4, layers: int = 1, implementation: str = "batched_mm", **sizes):
    import transformers as T

    common = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, num_experts_per_tok=2, max_position_embeddings=64,
                  experts_implementation=implementation, intermediate_size=48)
    if name == "mixtral":
        return T.MixtralConfig(**{**common, "num_local_experts": experts, **sizes})
    if name == "qwen2_moe":
        return T.Qwen2MoeConfig(**{**common, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 32,
                                   "num_experts": experts, **sizes})
    raise KeyError(f"unknown model {name!r}; one of {NAMES}")


CLASSES = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM"}


def build(name: str, batch: int = 4, dtype=torch.float64, device: str = "cpu", seed: int = 0, seq: int = SEQ, **cfg):
    """(model in training mode, keyword inputs with labels); the same on every call and process."""
    import transformers as T

    T.logging.set_verbosity_error()
    torch.manual_seed(seed)
    with torch.device(device):
        model = getattr(T, CLASSES[name])(config(name, **cfg)).to(dtype).train()
    ids = torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(1234 + batch))
    return model, dict(input_ids=ids.to(device), labels=ids.clone().to(device), use_cache=False)
