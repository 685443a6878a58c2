"""Calls LongSpec cannot honour fail before any work, naming the problem and the fix; the next call is a fresh one.

Every case ends with `assert_next_call_is_fresh`: the target's attention implementation is restored and the next
LongSpec call gives the tokens of plain greedy and the acceptance of a new draft with the same weights.
Saved-folder cases are in test_bad_checkpoint.py.
"""

import gc
import os
import re
from pathlib import Path

import pytest
import torch
from transformers import (
    DynamicCache,
    GenerationConfig,
    GPT2Config,
    GPT2LMHeadModel,
    StaticCache,
    SynthIDTextWatermarkingConfig,
)
from transformers.generation.streamers import BaseStreamer

from transformers_longspec import LongSpecConfig, LongSpecDraft

from tiny_models import assert_next_call_is_fresh, make_char_tokenizer, make_target

IDS = torch.randint(4, 99, (1, 12), generator=torch.Generator().manual_seed(0))


@pytest.fixture
def pair():
    target = make_target("llama")
    return target, LongSpecDraft.from_target(target, beam_widths=[2, 2])


def _filled_cache(target):
    cache = DynamicCache(config=target.config)
    target(IDS, past_key_values=cache)
    return cache


# name: (generate kwargs replacing the defaults, expected message); one distinct mistake each
CASES = {
    "batch of two": (dict(input_ids=IDS.repeat(2, 1)), "batch size 1"),
    "beam search": (dict(num_beams=2), "num_beams=2 cannot be combined"),
    "several return sequences": (dict(do_sample=True, num_return_sequences=2), "num_return_sequences has to be 1"),
    "empty prompt": (dict(input_ids=IDS[:, :0]), "prompt is empty"),
    "inputs_embeds only": (dict(input_ids=None, inputs_embeds="embeds"), "inputs_embeds is not supported"),
    "padding": (dict(attention_mask=torch.cat([torch.zeros(1, 3), torch.ones(1, 9)], 1).long()), "padding"),
    "token id beyond the vocabulary": (dict(input_ids=IDS + 100), "token id 1.., outside the target's vocabulary"),
    "negative token id": (dict(input_ids=torch.cat([IDS[:, :1] * 0 - 5, IDS], 1)), "token id -5, outside"),
    "float token ids": (dict(input_ids=IDS.float()), "integer token ids"),
    "no cache": (dict(use_cache=False), "needs the KV cache"),
    "filled dynamic cache": (dict(past_key_values="filled"), "manages its own target cache"),
    "static cache object": (dict(past_key_values="static"), r"got StaticCache"),
    "static cache implementation": (dict(cache_implementation="static"), "cache_implementation"),
    "zero width": (dict(longspec_beam_widths=[0]), "positive int width"),
    "negative width": (dict(longspec_beam_widths=[2, -1]), "positive int width"),
    "fractional width": (dict(longspec_beam_widths=[2, 2.5]), r"beam_widths\[1\] = 2.5"),
    "boolean width": (dict(longspec_beam_widths=[True]), "positive int width"),
    "widths as a string": (dict(longspec_beam_widths="4,16"), "not '4,16'"),
    "width not a list": (dict(longspec_beam_widths=4), "must be a list"),
    "wider than the vocabulary": (dict(longspec_beam_widths=[100000]), "exceeds the 99 candidates"),
    "deeper level too wide": (dict(longspec_beam_widths=[2, 500]), "exceeds the 198 candidates available at depth 2"),
    "too deep": (dict(longspec_beam_widths=[1] * 40), "at most 32"),
    "bad tree in generation_config": (dict(generation_config=GenerationConfig(longspec_beam_widths=[0])), "width"),
    "compile without static shapes": (dict(longspec_static_shapes=False, longspec_compile=True),
                                      "drop longspec_static_shapes=False or longspec_compile=True"),
    "compile where static shapes are off by default": (dict(longspec_compile=True),
                                                        "off by default on cpu: add longspec_static_shapes=True"),
    "compile given as a string": (dict(longspec_compile="no"), "must be True, False or None"),
    "static shapes given as a number": (dict(longspec_static_shapes=1), "must be True, False or None"),
    "misspelt option in generation_config": (dict(generation_config=GenerationConfig(longspec_compil=False)),
                                             r"\['longspec_compil'\] in generation_config"),
    "misspelt option": (dict(longspec_beam_width=[2, 2]), "unknown LongSpec option"),
    "zero tree nodes": (dict(longspec_tree_nodes=0), "verify at least 1 drafted node"),
    "tree nodes as a string": (dict(longspec_tree_nodes="68"), "longspec_tree_nodes must be an int"),
    "tree nodes as a boolean": (dict(longspec_tree_nodes=True), "longspec_tree_nodes must be an int"),
    "tree nodes without a tree": (dict(longspec_beam_widths=[], longspec_tree_nodes=5), "there is no draft tree"),
    "attentions": (dict(output_attentions=True, return_dict_in_generate=True), "output_attentions"),
    "hidden states": (dict(output_hidden_states=True, return_dict_in_generate=True), "output_hidden_states"),
    "prompt lookup": (dict(prompt_lookup_num_tokens=3), "prompt_lookup_num_tokens"),
    "assistant tokenizer": (dict(assistant_tokenizer=make_char_tokenizer(), tokenizer=make_char_tokenizer()),
                            "assistant_tokenizer` is not required"),
    "synced gpus": (dict(synced_gpus=True), "synced_gpus"),
    # options the tree decoding would ignore (a context beyond the target's is decoded: test_first_contact.py)
    "guidance scale": (dict(guidance_scale=1.5), "guidance_scale=1.5 cannot be honoured.*drop guidance_scale"),
    "num_assistant_tokens": (dict(num_assistant_tokens=5), "num_assistant_tokens=5 cannot be honoured"),
    "num_assistant_tokens at its default": (dict(num_assistant_tokens=20), "num_assistant_tokens=20 cannot be"),
    "num_assistant_tokens in generation_config": (
        dict(generation_config=GenerationConfig(num_assistant_tokens=7, max_new_tokens=5)), "num_assistant_tokens=7"),
    "confidence threshold": (dict(assistant_confidence_threshold=0.1), "assistant_confidence_threshold=0.1"),
    "assistant lookbehind": (dict(assistant_lookbehind=3), "assistant_lookbehind=3"),
    "early exit": (dict(assistant_early_exit=1), "assistant_early_exit=1"),
    "ensemble weight": (dict(assistant_ensemble_weight=0.5), "not lossless"),
    "low memory": (dict(low_memory=True), "low_memory=True"),
    "dola": (dict(dola_layers="high"), "dola_layers='high'"),
    "prefill chunks": (dict(prefill_chunk_size=4), "prefill_chunk_size=4"),
    "contrastive search": (dict(penalty_alpha=0.6, top_k=4), "select contrastive_search"),
    "forced words": (dict(force_words_ids=[[5]]), "select constrained_beam_search"),
    "synthid watermark": (dict(watermarking_config="synthid", do_sample=True), "SynthID watermarking"),
    "empty dynamic cache": (dict(past_key_values="empty"), r"do not pass past_key_values \(got DynamicCache\)"),
    "shifted positions": (dict(position_ids=torch.arange(5, 17)[None]), "positions 0 ... prompt_len - 1"),
    "model kwarg plain decoding would pass": (dict(labels=IDS), r"does not pass \['labels'\] to the target"),
    "1-D input_ids": (dict(input_ids=IDS[0]), r"\(1, prompt_len\).*got a 1-D tensor of shape \(12,\).*ids\[None\]"),
    "input_ids as a list": (dict(input_ids=IDS[0].tolist()), r"got a list.*torch.tensor\(\[ids\]\)"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_call_is_refused_and_next_call_is_fresh(case, pair):
    target, draft = pair
    kwargs, message = CASES[case]
    kwargs = {"input_ids": IDS, "max_new_tokens": 5, "do_sample": False, **kwargs}
    special = {"filled": _filled_cache(target), "static": StaticCache(config=target.config, max_cache_len=64),
               "embeds": target.get_input_embeddings()(IDS), "empty": DynamicCache(config=target.config),
               "synthid": SynthIDTextWatermarkingConfig(keys=[654, 400, 836, 123, 340], ngram_len=3)}
    kwargs = {k: special[v] if isinstance(v, str) and v in special else v for k, v in kwargs.items()}
    target.generate(IDS, assistant_model=draft, max_new_tokens=2, do_sample=False)
    assert draft.last_generation_stats.finished
    with pytest.raises(ValueError, match=message):
        target.generate(assistant_model=draft, **{k: v for k, v in kwargs.items() if v is not None})
    assert draft.last_generation_stats is None  # a refused call leaves no statistics, not the previous call's
    assert_next_call_is_fresh(target, draft, IDS)


@pytest.mark.parametrize("size, value, message", [
    ("hidden_size", 48, "hidden_size: draft 32 vs target 48"),
    ("num_attention_heads", 8, "num_attention_heads: draft 4 vs target 8"),
    ("num_key_value_heads", 4, "num_key_value_heads: draft 2 vs target 4"),
    ("vocab_size", 120, "vocab_size: draft 99 vs target 120"),
    ("head_dim", 16, "head_dim: draft 8 vs target 16"),
])
def test_draft_built_for_another_target_names_the_size(size, value, message, pair):
    target, draft = pair
    other = make_target("llama", **{size: value})
    with pytest.raises(ValueError, match=message + r".*LongSpecDraft.from_target"):
        other.generate(IDS, assistant_model=draft, max_new_tokens=3)
    with pytest.raises(ValueError, match=message):
        draft.attach_target(other)
    assert_next_call_is_fresh(target, draft, IDS)


def test_unsupported_target_architecture(pair):
    target, draft = pair
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=99)).eval()
    with pytest.raises(ValueError, match="support targets of type .* got 'gpt2'"):
        gpt2.generate(IDS, assistant_model=draft, max_new_tokens=3)
    assert_next_call_is_fresh(target, draft, IDS)


def test_target_switched_to_sliding_window_attention():
    target = make_target("mistral")
    draft = LongSpecDraft.from_target(target, beam_widths=[2, 2])
    target.config.sliding_window = 16
    with pytest.raises(ValueError, match="sliding_window=16; LongSpec needs full attention"):
        target.generate(IDS, assistant_model=draft, max_new_tokens=3)
    target.config.sliding_window = None
    assert_next_call_is_fresh(target, draft, IDS)


def test_tree_deeper_than_the_draft_window():
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, beam_widths=[2, 2], sliding_window=3)
    with pytest.raises(ValueError, match="depth 3 needs sliding_window > depth"):
        target.generate(IDS, assistant_model=draft, max_new_tokens=3, longspec_beam_widths=[1, 1, 1])
    assert_next_call_is_fresh(target, draft, IDS)


def test_draft_never_attached(pair):
    target, draft = pair
    loose = LongSpecDraft(draft.config)
    with pytest.raises(ValueError, match="not attached to this target.*attach_target"):
        target.generate(IDS, assistant_model=loose, max_new_tokens=3)
    with pytest.raises(ValueError, match="not attached to a target"):
        loose.embed(IDS)
    assert_next_call_is_fresh(target, draft, IDS)


def test_draft_attached_to_another_target(pair):
    target, draft = pair
    other = make_target("llama", seed=1)
    with pytest.raises(ValueError, match="not attached to this target"):
        other.generate(IDS, assistant_model=draft, max_new_tokens=3)
    assert_next_call_is_fresh(target, draft, IDS)


def test_draft_whose_target_was_freed():
    draft = LongSpecDraft.from_target(make_target("llama"), beam_widths=[2, 2])
    gc.collect()
    assert draft.target_model is None
    with pytest.raises(ValueError, match="not attached to a target"):
        draft.embed(IDS)
    target = make_target("llama")
    with pytest.raises(ValueError, match="not attached to this target"):
        target.generate(IDS, assistant_model=draft, max_new_tokens=3)
    assert_next_call_is_fresh(target, draft.attach_target(target), IDS)


def test_draft_dtype_differs_from_target(pair):
    target, draft = pair
    draft.to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"float32; call draft.to\(device='cpu', dtype=torch.float32\)"):
        target.generate(IDS, assistant_model=draft, max_new_tokens=3)
    assert_next_call_is_fresh(target, draft.to(torch.float32), IDS)


def test_draft_device_differs_from_target(pair):
    target, draft = pair
    moved = LongSpecDraft(draft.config).to("meta").attach_target(target)
    with pytest.raises(ValueError, match=r"draft is on meta.*call draft.to\(device='cpu'"):
        target.generate(IDS, assistant_model=moved, max_new_tokens=3)
    assert_next_call_is_fresh(target, draft, IDS)


def test_longspec_options_with_another_assistant(pair):
    target, draft = pair
    other = make_target("llama", seed=3)
    with pytest.raises(ValueError, match=r"apply only with a LongSpecDraft.*got LlamaForCausalLM"):
        target.generate(IDS, assistant_model=other, max_new_tokens=3, longspec_beam_widths=[2])
    assert_next_call_is_fresh(target, draft, IDS)


def test_longspec_options_without_assistant(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="apply only with a LongSpecDraft.*got no assistant_model"):
        target.generate(IDS, max_new_tokens=3, longspec_beam_widths=[2])
    assert_next_call_is_fresh(target, draft, IDS)


def test_draft_wrapped_by_peft(pair):
    peft = pytest.importorskip("peft")
    target, draft = pair
    wrapped = peft.get_peft_model(LongSpecDraft.from_target(target), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    with pytest.raises(ValueError, match="wrapped by PeftModel.*merge_lora_draft"):
        target.generate(IDS, assistant_model=wrapped, max_new_tokens=3)
    assert_next_call_is_fresh(target, draft, IDS)


@pytest.mark.parametrize("path", ["some/draft", Path("some/draft")], ids=["str", "PathLike"])
def test_draft_given_as_a_path(path, pair):
    """A path instead of a loaded draft: a TypeError naming the fix (stock generate fails later with an
    AttributeError on `assistant_model.config`)."""
    target, draft = pair
    message = (rf"assistant_model is a path \({re.escape(repr(os.fspath(path)))}\).*"
               r"LongSpecDraft\.from_pretrained\(path, target_model=model\)")
    with pytest.raises(TypeError, match=message):
        target.generate(IDS, assistant_model=path, max_new_tokens=3)
    assert_next_call_is_fresh(target, draft, IDS)


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_non_finite_target_logits(poison, pair):
    target, draft = pair
    weight = target.lm_head.weight
    saved = weight.detach().clone()
    with torch.no_grad():
        weight[5] = poison
    with pytest.raises(ValueError, match="NaN or inf logits for the prompt"):
        target.generate(IDS, assistant_model=draft, max_new_tokens=3)
    with torch.no_grad():
        weight.copy_(saved)
    assert not target.lm_head._forward_hooks
    assert_next_call_is_fresh(target, draft, IDS)


class _Interrupting(BaseStreamer):
    """Raises `error` at the `at`-th token put (the prompt is put first)."""

    def __init__(self, error: BaseException, at: int = 3):
        self.error, self.at, self.calls = error, at, 0

    def put(self, value):
        self.calls += 1
        if self.calls == self.at:
            raise self.error

    def end(self):
        pass


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("client went away")], ids=["ctrl-c", "error"])
def test_streamed_run_interrupted(error, pair):
    target, draft = pair
    with pytest.raises(type(error)):
        target.generate(IDS, assistant_model=draft, max_new_tokens=12, streamer=_Interrupting(error))
    assert_next_call_is_fresh(target, draft, IDS, max_new_tokens=12)


def test_stop_strings_stop_where_plain_generate_stops(pair):
    target, draft = pair
    tokenizer = make_char_tokenizer()
    plain = target.generate(IDS, max_new_tokens=30, do_sample=False)[0, IDS.shape[1]:].tolist()
    start = next(i for i in range(6, 27) if min(plain[i : i + 3]) >= 4)  # three printable characters
    stop = tokenizer.decode(plain[start : start + 3])
    kwargs = dict(max_new_tokens=30, do_sample=False, stop_strings=[stop], tokenizer=tokenizer)
    expected = target.generate(IDS, **kwargs)
    assert expected.shape[1] < IDS.shape[1] + 30 and tokenizer.decode(expected[0]).endswith(stop)
    assert torch.equal(target.generate(IDS, assistant_model=draft, **kwargs), expected)
    assert_next_call_is_fresh(target, draft, IDS)


def test_draft_of_another_family_with_equal_sizes_warns(pair):
    target, draft = pair
    qwen = make_target("qwen2")
    with pytest.warns(UserWarning, match="built for a llama target with 2 layers, not for this qwen2 target"):
        draft.attach_target(qwen)
    assert torch.equal(qwen.generate(IDS, assistant_model=draft, max_new_tokens=6, do_sample=False),
                       qwen.generate(IDS, max_new_tokens=6, do_sample=False))
    assert_next_call_is_fresh(target, draft.attach_target(target), IDS)


@pytest.mark.parametrize("overrides, message", [
    (dict(sliding_window=0), "sliding_window must be a positive number of tokens"),
    (dict(num_key_value_heads=3), r"multiple of num_key_value_heads \(3\)"),
])
def test_invalid_draft_config(overrides, message):
    with pytest.raises(ValueError, match=message):
        LongSpecConfig(**{"hidden_size": 32, "num_attention_heads": 4, **overrides})


def test_guidance_scale_one_is_no_guidance_and_decodes(pair):
    """guidance_scale=1 is transformers' "no classifier-free guidance": LongSpec decodes as plain greedy does."""
    target, draft = pair
    plain = target.generate(IDS, max_new_tokens=6, do_sample=False, guidance_scale=1.0)
    out = target.generate(IDS, assistant_model=draft, max_new_tokens=6, do_sample=False, guidance_scale=1.0)
    assert torch.equal(out, plain) and draft.last_generation_stats.finished
