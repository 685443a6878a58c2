"""Calls LongSpec cannot honour fail before any work, naming the problem and the fix; the next call still works."""

import pytest
import torch
from transformers import DynamicCache

from transformers_longspec import LongSpecDraft

from tiny_models import make_target

IDS = torch.randint(3, 99, (1, 12), generator=torch.Generator().manual_seed(0))


def _filled_cache(target):
    cache = DynamicCache(config=target.config)
    target(IDS, past_key_values=cache)
    return cache


CASES = {
    "batch of two": (dict(input_ids=IDS.repeat(2, 1)), "batch size 1"),
    "beam search": (dict(num_beams=2), "num_beams=2 cannot be combined"),
    "empty prompt": (dict(input_ids=IDS[:, :0]), "prompt is empty"),
    "padding": (dict(attention_mask=torch.cat([torch.zeros(1, 3), torch.ones(1, 9)], 1).long()), "padding"),
    "no cache": (dict(use_cache=False), "needs the KV cache"),
    "filled cache": (dict(past_key_values="filled"), "manages its own target cache"),
    "zero width": (dict(longspec_beam_widths=[0]), "positive int width"),
    "negative width": (dict(longspec_beam_widths=[2, -1]), "positive int width"),
    "too wide": (dict(longspec_beam_widths=[100000]), "exceeds the 99 candidates"),
    "too deep": (dict(longspec_beam_widths=[1] * 40), "at most 32"),
    "typo option": (dict(longspec_beam_width=[2, 2]), "unknown LongSpec option"),
    "attentions": (dict(output_attentions=True, return_dict_in_generate=True), "output_attentions"),
    "beyond context": (dict(max_new_tokens=40000), "exceeds the target's context"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_call_is_refused_and_next_call_works(case):
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, beam_widths=[2, 2])
    kwargs, message = CASES[case]
    kwargs = {"input_ids": IDS, "max_new_tokens": 5, "do_sample": False, **kwargs}
    if kwargs.get("past_key_values") == "filled":
        kwargs["past_key_values"] = _filled_cache(target)
    with pytest.raises(ValueError, match=message):
        target.generate(assistant_model=draft, **kwargs)
    good = target.generate(IDS, assistant_model=draft, max_new_tokens=5, do_sample=False)
    assert torch.equal(good, target.generate(IDS, max_new_tokens=5, do_sample=False))


def test_draft_of_another_target_names_the_sizes():
    draft = LongSpecDraft.from_target(make_target("llama", hidden_size=48))
    with pytest.raises(ValueError, match="hidden_size: draft 48 vs target 32"):
        make_target("llama").generate(IDS, assistant_model=draft, max_new_tokens=3)


def test_unattached_and_mismatched_dtype_drafts():
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target)
    other = make_target("llama", seed=1)
    with pytest.raises(ValueError, match="not attached to this target"):
        other.generate(IDS, assistant_model=draft, max_new_tokens=3)
    draft.to(torch.bfloat16)
    with pytest.raises(ValueError, match="call draft.to"):
        target.generate(IDS, assistant_model=draft, max_new_tokens=3)
