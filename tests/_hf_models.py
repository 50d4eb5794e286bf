"""Tiny random-init transformers models (no download) for the integration tests."""

import torch

SDPA = "sdpa"


def tiny_config(kind="llama", **overrides):
    from transformers import LlamaConfig, MistralConfig

    common = {
        "vocab_size": 512,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,  # GQA
        "max_position_embeddings": 1024,
        "initializer_range": 0.1,  # logits well apart: greedy decoding has no near-ties
        "pad_token_id": 0,
    }
    common.update(overrides)
    if kind == "mistral":
        common.setdefault("sliding_window", 24)
        return MistralConfig(**common)
    return LlamaConfig(**common)


def tiny_model(config, attn_implementation, dtype=torch.float32, device="cpu", seed=0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=dtype)
    return model.to(device).eval()


def padded_batch(lengths, total, side, vocab=512, device="cpu", seed=0):
    """input_ids and attention_mask (b, total) with each row's tokens on the given side."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (len(lengths), total), generator=g)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for i, n in enumerate(lengths):
        if side == "left":
            mask[i, total - n:] = 1
        else:
            mask[i, :n] = 1
    ids = ids.masked_fill(mask == 0, 0)
    return ids.to(device), mask.to(device)
