"""Targets as users load them: fp32 / bf16 / fp16 weights, their own `generation_config` defaults, `device_map="auto"`.
PEFT-wrapped targets are in test_peft_target.py.

Low precision: on these CPU models and seeds the tree forward and the one-token forwards pick the same argmax at
every step, so greedy output is identical in every dtype. On a GPU, bf16 may differ at numerical near-ties (top-2
logit gap of about one rounding step); benchmarks/NOTES.md reports those.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from transformers_longspec import LongSpecDraft

from tiny_models import make_target

IDS = torch.randint(4, 99, (1, 20), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_greedy_equals_plain_greedy_in_each_dtype(family, dtype):
    target = make_target(family).to(dtype)
    draft = LongSpecDraft.from_target(target, beam_widths=[3, 3])
    assert next(draft.parameters()).dtype == dtype
    plain = target.generate(IDS, do_sample=False, max_new_tokens=24)
    assert torch.equal(target.generate(IDS, assistant_model=draft, do_sample=False, max_new_tokens=24), plain)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_saved_fp32_draft_loads_in_the_target_dtype(dtype, tmp_path):
    target = make_target("llama")
    LongSpecDraft.from_target(target, beam_widths=[3, 3]).save_pretrained(tmp_path)
    target.to(dtype)
    draft = LongSpecDraft.from_pretrained(tmp_path, target_model=target)
    assert next(draft.parameters()).dtype == dtype
    plain = target.generate(IDS, do_sample=False, max_new_tokens=16)
    assert torch.equal(target.generate(IDS, assistant_model=draft, do_sample=False, max_new_tokens=16), plain)


def test_target_generation_config_defaults_are_honoured():
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, beam_widths=[2, 2])
    unbounded = target.generate(IDS, do_sample=False, max_new_tokens=12)[0, IDS.shape[1]:].tolist()
    eos = unbounded[5]
    target.generation_config.update(max_new_tokens=12, eos_token_id=eos, do_sample=False)
    target.generation_config.longspec_beam_widths = [3]  # a custom entry, as GenerationConfig(longspec_...=) makes
    plain = target.generate(IDS)
    assert plain.shape[1] == IDS.shape[1] + unbounded.index(eos) + 1  # stopped at the configured EOS
    assert torch.equal(target.generate(IDS, assistant_model=draft), plain)
    assert draft.last_generation_stats.beam_widths == (3,)  # LongSpec options in generation_config apply too
    target.generation_config.eos_token_id = None
    assert target.generate(IDS, assistant_model=draft).shape[1] == IDS.shape[1] + 12  # max_new_tokens default


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="device_map='auto' needs a CUDA device")
def test_device_map_auto_target(tmp_path):
    make_target("qwen2").save_pretrained(tmp_path)
    target = AutoModelForCausalLM.from_pretrained(tmp_path, device_map="auto", dtype=torch.bfloat16).eval()
    draft = LongSpecDraft.from_target(target, beam_widths=[4, 4])
    ids = IDS.to(target.device)
    plain = target.generate(ids, do_sample=False, max_new_tokens=32)
    assert torch.equal(target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=32), plain)
