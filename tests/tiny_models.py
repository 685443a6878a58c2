"""Tiny targets built in code (no hub): one per supported family, fixed seeds."""

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

TINY = dict(vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=32768, bos_token_id=1, eos_token_id=2, pad_token_id=0,
            initializer_range=0.4)
FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
}


def make_target(family: str = "llama", seed: int = 0, **overrides):
    """A tiny random target of `family` in fp32 eval mode (vocab 99, hidden 32, 2 layers, GQA 4/2)."""
    config_cls, model_cls = FAMILIES[family]
    extra = {"sliding_window": None} if family == "mistral" else {}
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**TINY, **extra, **overrides}))
    return model.eval()
