"""Training LongSpec drafts with the transformers `Trainer` (`transformers_longspec.trainers`).

    from transformers_longspec.trainers import LongSpecTrainer, LongSpecTrainingArguments, TokenCollator, pack_texts
    draft = LongSpecDraft.from_target(target).float()
    blocks = pack_texts(python_package_sources(["torch", "transformers"]), tokenizer, seq_length=1024)
    args = LongSpecTrainingArguments(output_dir="out", bf16=True, learning_rate=5e-4, lr_scheduler_type="cosine")
    LongSpecTrainer(model=draft, target_model=target, args=args, train_dataset=blocks,
                    data_collator=TokenCollator(tokenizer.pad_token_id)).train()

Training data (`corpus.py`, `mix.py`, `chat_distill.py`): code of several languages and prose from the installed
packages and the system's docs, long rows, and the target's own chat answers, evaluation material refused
(`exclusions.py`); the `mix` recipe source builds it all. Recipes for the three training stages are in
`trainers/recipes/` (see its README.md); the `longspec train` command runs them. Multi-GPU training
(`accelerate launch` with FSDP or DeepSpeed; the frozen target is sharded by the trainer):
`trainers/distributed/README.md`.

Reference: LongSpec (arXiv 2502.17421) §3.2 and §4.1.
"""

from .anchor_offset import anchor_offset_position_ids
from .arguments import LongSpecTrainingArguments
from .chat_distill import chat_distill_rows, chat_prompts, generate_answers, render_prompts
from .corpus import corpus_documents, repository_documents
from .data import (
    ChatCollator,
    TextCollator,
    TokenCollator,
    longbench_to_messages,
    pack_texts,
    read_longbench_jsonl,
)
from .exclusions import evaluation_reason, refuse_evaluation
from .lora import LORA_TARGET_MODULES, add_lora_to_draft, load_lora_draft, merge_lora_draft
from .mix import MixSpec, StepCollator, build_mix
from .noisy import mask_noisy_labels, noise_visibility_mask, sample_noise_offset
from .sharding import shard_target
from .soft_labels import soft_distill_loss, target_topk
from .sources import python_package_sources, self_distill_texts, source_snippet_prompts
from .time_budget import TimeBudgetCallback
from .trainer import LongSpecTrainer, save_trained_draft, target_greedy_labels, target_last_layer_kv, unwrap_draft

__all__ = [
    "LORA_TARGET_MODULES",
    "ChatCollator",
    "LongSpecTrainer",
    "LongSpecTrainingArguments",
    "MixSpec",
    "StepCollator",
    "TextCollator",
    "TimeBudgetCallback",
    "TokenCollator",
    "add_lora_to_draft",
    "anchor_offset_position_ids",
    "build_mix",
    "chat_distill_rows",
    "chat_prompts",
    "corpus_documents",
    "evaluation_reason",
    "generate_answers",
    "load_lora_draft",
    "longbench_to_messages",
    "mask_noisy_labels",
    "merge_lora_draft",
    "noise_visibility_mask",
    "pack_texts",
    "python_package_sources",
    "read_longbench_jsonl",
    "refuse_evaluation",
    "render_prompts",
    "repository_documents",
    "sample_noise_offset",
    "save_trained_draft",
    "self_distill_texts",
    "shard_target",
    "soft_distill_loss",
    "source_snippet_prompts",
    "target_greedy_labels",
    "target_last_layer_kv",
    "target_topk",
    "unwrap_draft",
]
