"""LoRA domain adaptation of a trained draft with peft (skipped when peft is not installed)."""

import pytest
import torch
from safetensors.torch import load_file

from transformers_longspec import LongSpecDraft
from transformers_longspec.trainers import (
    LongSpecTrainer,
    LongSpecTrainingArguments,
    TokenCollator,
    add_lora_to_draft,
    load_lora_draft,
    merge_lora_draft,
)

from tiny_models import make_target

peft = pytest.importorskip("peft")

ROWS = [{"input_ids": torch.randint(3, 99, (32,), generator=torch.Generator().manual_seed(i))} for i in range(4)]


def test_lora_fine_tune_saves_adapter_and_merges_into_a_draft(tmp_path):
    target = make_target("llama")
    base = LongSpecDraft.from_target(target)
    base.save_pretrained(tmp_path / "base")
    frozen = {k: v.clone() for k, v in base.state_dict().items()}
    model = add_lora_to_draft(base, r=4, alpha=8)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any("cross_attn.q_proj" in n for n in trainable) and any("mlp.down_proj" in n for n in trainable)
    args = LongSpecTrainingArguments(output_dir=str(tmp_path / "run"), use_cpu=True, report_to=[], disable_tqdm=True,
                                     per_device_train_batch_size=4, learning_rate=3e-2, max_steps=3, save_steps=3,
                                     logging_steps=1, seed=0, noisy_training=False, anchor_offset=False)
    trainer = LongSpecTrainer(model=model, target_model=target, args=args, train_dataset=ROWS, eval_dataset=ROWS,
                              data_collator=TokenCollator(0))
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    assert trainer.evaluate()["eval_loss"] < before - 0.3
    adapter = tmp_path / "run" / "checkpoint-3"
    assert (adapter / "adapter_config.json").exists()
    assert all("lora_" in k for k in load_file(adapter / "adapter_model.safetensors"))

    merged = merge_lora_draft(model)
    assert isinstance(merged, LongSpecDraft) and set(merged.state_dict()) == set(frozen)
    assert any(not torch.equal(merged.state_dict()[k], v) for k, v in frozen.items())
    ids = torch.randint(3, 99, (1, 16), generator=torch.Generator().manual_seed(3))
    plain = target.generate(ids, do_sample=False, max_new_tokens=10)
    assert torch.equal(target.generate(ids, assistant_model=merged, do_sample=False, max_new_tokens=10), plain)

    reloaded = load_lora_draft(LongSpecDraft.from_pretrained(tmp_path / "base", target_model=target), str(adapter))
    for name, tensor in merged.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[name], tensor, msg=name)


def test_lora_rejects_non_drafts():
    with pytest.raises(TypeError, match="LongSpecDraft"):
        add_lora_to_draft(make_target("llama"))
