"""Tiny targets built in code (no hub): one per supported family, fixed seeds; a tokenizer for their vocabulary."""

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
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
# ids 0-3 are special, then the 95 printable ASCII characters: 99 tokens, the tiny targets' vocab_size.
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def make_target(family: str = "llama", seed: int = 0, **overrides):
    """A tiny random target of `family` in fp32 eval mode (vocab 99, hidden 32, 2 layers, GQA 4/2)."""
    config_cls, model_cls = FAMILIES[family]
    extra = {"sliding_window": None} if family == "mistral" else {}
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**TINY, **extra, **overrides}))
    return model.eval()


def make_char_tokenizer(chat_template: str | None = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """One token per printable ASCII character (anything else is <unk>), with a ChatML-like template."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({chr(c): len(SPECIALS) + i for i, c in enumerate(range(32, 127))})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.chat_template = chat_template
    return fast


def assert_next_call_is_fresh(target, draft, ids: torch.Tensor, max_new_tokens: int = 8) -> None:
    """After a refused or interrupted call: the target's attention is restored, and the next LongSpec call equals a
    fresh run — the same tokens as plain greedy and the same acceptance as a new draft with the same weights."""
    from transformers_longspec import LongSpecDraft

    assert target.config._attn_implementation != "longspec"
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False)
    out = target.generate(ids, assistant_model=draft, **kwargs)
    accepted = draft.last_generation_stats.accepted_lengths
    fresh = LongSpecDraft(draft.config).to(next(target.parameters()).dtype)
    fresh.load_state_dict(draft.state_dict())
    fresh.attach_target(target)
    assert torch.equal(out, target.generate(ids, assistant_model=fresh, **kwargs))
    assert accepted == fresh.last_generation_stats.accepted_lengths
    assert torch.equal(out, target.generate(ids, **kwargs))
