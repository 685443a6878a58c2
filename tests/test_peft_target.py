"""A target wrapped by PEFT (LoRA adapters, unmerged and merged) hosts a LongSpec draft; output stays exact."""

import pytest
import torch

from transformers_longspec import LongSpecDraft

from tiny_models import make_target

peft = pytest.importorskip("peft")


def test_lora_target_unmerged_and_merged(family):
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    wrapped = peft.get_peft_model(make_target(family), config)
    ids = torch.randint(3, 99, (1, 20), generator=torch.Generator().manual_seed(0))
    _assert_exact(wrapped, ids)  # LoRA layers active, unmerged
    _assert_exact(wrapped.merge_and_unload(), ids)


def _assert_exact(target, ids):
    draft = LongSpecDraft.from_target(target, beam_widths=[2, 2])
    plain = target.generate(input_ids=ids, do_sample=False, max_new_tokens=15)
    spec = target.generate(input_ids=ids, assistant_model=draft, do_sample=False, max_new_tokens=15)
    assert torch.equal(plain, spec)
