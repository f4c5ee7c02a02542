"""Six small Hugging Face models built from their configs (no download) and a training call each.

GPT-2 keeps its default config (``use_cache=True``: a ``DynamicCache`` in its output), Llama has
grouped-query attention (4 query heads, 2 key/value heads), ResNet bottleneck blocks with batch
norm, ConvNeXt stochastic depth when ``drop_path`` > 0. Widths 64-128, 2 layers, vocab 512.
``device="meta"`` builds them without memory, as a user plans a big model.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # configs only: never touch the network

import torch  # noqa: E402

NAMES = ("gpt2", "bert", "llama", "vit", "resnet", "convnext")
VOCAB, SEQ = 512, 16


def config(name: str, dropout: float = 0.0, drop_path: float = 0.0, layers: int = 2):
    import transformers as T

    if name == "gpt2":
        return T.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=layers, n_head=4,
                            resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                            bos_token_id=0, eos_token_id=0)
    if name == "bert":
        return T.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                            intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=dropout,
                            attention_probs_dropout_prob=dropout)
    if name == "llama":
        return T.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                             attention_dropout=dropout)
    if name == "vit":
        return T.ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=64, num_hidden_layers=layers,
                           num_attention_heads=4, intermediate_size=128, num_labels=10,
                           hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    if name == "resnet":
        return T.ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1] * layers,
                              layer_type="bottleneck", num_labels=10)
    if name == "convnext":
        return T.ConvNextConfig(num_channels=3, hidden_sizes=[16, 32], depths=[1] * layers, num_stages=2,
                                num_labels=10, image_size=32, drop_path_rate=drop_path)
    raise KeyError(f"unknown model {name!r}; one of {NAMES}")


CLASSES = {"gpt2": "GPT2LMHeadModel", "bert": "BertForMaskedLM", "llama": "LlamaForCausalLM",
           "vit": "ViTForImageClassification", "resnet": "ResNetForImageClassification",
           "convnext": "ConvNextForImageClassification"}


def build(name: str, batch: int = 2, device: str = "cpu", seed: int = 0, **sizes):
    """(model in training mode, example kwargs with labels)."""
    import transformers as T

    transformers_quiet()
    torch.manual_seed(seed)
    with torch.device(device):
        model = getattr(T, CLASSES[name])(config(name, **sizes)).train()
    g = torch.Generator().manual_seed(1234 + batch)
    if name in ("gpt2", "bert", "llama"):
        ids = torch.randint(0, VOCAB, (batch, SEQ), generator=g)
        kwargs = dict(input_ids=ids, attention_mask=torch.ones(batch, SEQ, dtype=torch.long), labels=ids.clone())
        if name == "bert":
            kwargs["token_type_ids"] = torch.zeros(batch, SEQ, dtype=torch.long)
    else:
        kwargs = dict(pixel_values=torch.randn(batch, 3, 32, 32, generator=g),
                      labels=torch.randint(0, 10, (batch,), generator=g))
    return model, {k: v.to(device) for k, v in kwargs.items()}


def transformers_quiet() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
