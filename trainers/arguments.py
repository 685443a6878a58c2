"""`LongSpecTrainingArguments`: `TrainingArguments` plus the options of LongSpec draft training.

Reference: LongSpec (arXiv 2502.17421) §3.2; transformers `TrainingArguments`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import TrainingArguments

from .noisy import check_noise_offsets_per_step
from .sharding import TARGET_SHARDING_MODES

__all__ = ["LONGSPEC_DEFAULTS", "LongSpecTrainingArguments"]


@dataclass
class LongSpecTrainingArguments(TrainingArguments):
    """`TrainingArguments` for [`LongSpecTrainer`], with the anchor-offset and noisy-training options.

    Args (beyond `TrainingArguments`):
        anchor_offset (`bool`): draw anchor-offset position ids for sequences shorter than `anchor_max_length`.
        anchor_sinks (`int`): leading positions kept in place (attention sinks); 4 in the paper.
        anchor_max_length (`int`): tokens; sequences of this length or longer keep positions 0..seq-1.
        max_position (`int` or None): tokens; the largest position id drawn is `max_position - 1`.
            None = the target's `max_position_embeddings`.
        noisy_training (`bool`): draw the noise offset j in [1, noise_max] each step (else j = 1).
        noise_max (`int`): gamma - 1, the largest j (tokens); 4 for the default depth-5 tree.
        noise_weights (`list[float]` or None): relative probabilities of j = 1..noise_max (None: uniform, as in the
            paper). j is the tree level a step trains for, and level 1 gates every deeper one: e.g.
            [0.4, 0.3, 0.2, 0.1] spends more of the steps on the first draft token.
        noise_offsets_per_step (`int`): distinct offsets j trained per step, on one pass of the frozen target (its
            forward is the largest part of a step); the loss is their mean. 1 = the paper's one offset per step;
            `noise_max` = every tree level every step.
        index_seed (`int` or None): seed of the position-id / noise RNG; None = `seed`. Draws are derived from
            (index_seed, process, global step, micro-step), so a resumed run repeats the draws of an
            uninterrupted one.
        distill_labels (`bool`): self-distillation — supervise each position with the target's own greedy next
            token (argmax of its logits there, `target_greedy_labels`) instead of the text's next token; greedy
            acceptance is agreement with that argmax. Evaluation losses then measure that agreement too.
        soft_labels_topk (`int`): soft distillation: also train on the target's top-k next-token distribution
            (renormalised over its k largest logits, `soft_labels.py`); 0 = off. 8-32 covers what a tree proposes.
        soft_labels_weight (`float`): weight w of the soft loss: loss = (1 - w) * hard CE + w * soft CE (1 = soft
            only). The hard labels are the text's or, with `distill_labels`, the target's argmax.
        draft_vocab_loss (`bool`): compute the loss's softmax over the draft's own vocabulary (its
            `draft_vocab` frequent tokens) plus every token of the batch, instead of the target's whole vocabulary
            (`generate` proposes from the vocabulary plus the prompt's tokens): the LM head of the loss reads a
            fraction of its rows (Qwen2.5: ~37k of 151,936). Target top-k ids outside the set leave the soft target
            (the rest renormalised). A position is unsupervised when its hard label is outside the set (possible
            with `distill_labels`) or when none of its top-k is in it. Losses, evaluation included, then depend on
            which rows share a batch and are not comparable with full-vocabulary ones. Needs `soft_labels_topk` > 0
            and a draft with a vocabulary (`config.draft_vocab_size` > 0).
        loss_chunk_size (`int`): positions per LM-head chunk in the loss (bounds the logits memory: one chunk of
            logits is alive at a time, the backward pass recomputes each).
        target_sharding (`str`): "auto" shards the frozen target over the processes with FSDP2 when the draft
            trains under FSDP or DeepSpeed ZeRO-3 (embedding and LM head stay whole on every process), "fsdp"
            shards it in any multi-process run (DDP too), "none" keeps a whole copy per process.
        remove_unused_columns (`bool`): must stay False: the LongSpec collators read raw columns (`text`,
            `messages`) that the draft's `forward` does not take.

    Raises: ValueError from `__post_init__` for a negative sink count, non-positive lengths, `noise_max` < 1,
        `noise_weights` that are not `noise_max` non-negative numbers with a positive sum,
        `noise_offsets_per_step` outside [1, noise_max] (or above the non-zero weights), an unknown
        `target_sharding`, `soft_labels_topk` < 0, `soft_labels_weight` outside [0, 1], `draft_vocab_loss` without
        soft labels or `remove_unused_columns=True`.
    Reference: LongSpec §3.2 (Alg. 1 anchor-offset, Alg. 2 flash noisy training); transformers `TrainingArguments`.
    """

    anchor_offset: bool = field(
        default=True,
        metadata={"help": "Shift positions after the attention sinks by a random offset on short sequences."},
    )
    anchor_sinks: int = field(
        default=4, metadata={"help": "Leading positions kept in place by anchor-offset (attention sinks)."}
    )
    anchor_max_length: int = field(
        default=2048,
        metadata={"help": "Anchor-offset applies only to sequences shorter than this many tokens."},
    )
    max_position: int | None = field(
        default=None,
        metadata={"help": "Largest position id + 1 anchor-offset may draw; default: target max_position_embeddings."},
    )
    noisy_training: bool = field(
        default=True,
        metadata={"help": "Flash noisy training: the draft sees target KV up to j tokens back, j ~ U[1, noise_max]."},
    )
    noise_max: int = field(
        default=4, metadata={"help": "Largest noise offset j (gamma - 1 for a tree of depth gamma)."}
    )
    noise_weights: list[float] | None = field(
        default=None,
        metadata={"help": "Relative probabilities of the noise offsets j = 1..noise_max (default: uniform)."},
    )
    noise_offsets_per_step: int = field(
        default=1, metadata={"help": "Distinct noise offsets trained per step on one target pass (loss: their mean)."}
    )
    index_seed: int | None = field(
        default=None, metadata={"help": "Seed of the anchor-offset / noise draws; default: --seed."}
    )
    distill_labels: bool = field(
        default=False,
        metadata={"help": "Self-distillation: train on the target's greedy next token instead of the text's."},
    )
    soft_labels_topk: int = field(
        default=0,
        metadata={"help": "Soft distillation: KL to the target's top-k next-token distribution (k tokens; 0 = off)."},
    )
    soft_labels_weight: float = field(
        default=1.0,
        metadata={"help": "Soft loss weight w: (1 - w) * hard CE + w * soft CE (when soft_labels_topk > 0)."},
    )
    draft_vocab_loss: bool = field(
        default=False,
        metadata={"help": "Loss softmax over the draft's vocabulary + the batch's tokens (needs soft_labels_topk)."},
    )
    loss_chunk_size: int = field(
        default=2048, metadata={"help": "Positions per LM-head chunk in the draft loss (bounds logits memory)."}
    )
    target_sharding: str = field(
        default="auto",
        metadata={"help": "Shard the frozen target over processes: auto (under FSDP / ZeRO-3), fsdp (always), none."},
    )
    remove_unused_columns: bool = field(
        default=False,
        metadata={"help": "Must be False for LongSpec training: the collators read raw text/messages columns."},
    )

    def __post_init__(self):
        if self.remove_unused_columns:
            raise ValueError(
                "remove_unused_columns=True would strip the columns the LongSpec collators read (text, messages, "
                "labels); leave it at False for LongSpecTrainingArguments"
            )
        if self.anchor_sinks < 0:
            raise ValueError(f"anchor_sinks must be >= 0 (4 in the paper), got {self.anchor_sinks}")
        if self.anchor_max_length < 1:
            raise ValueError(f"anchor_max_length must be a positive number of tokens, got {self.anchor_max_length}")
        if self.max_position is not None and self.max_position < 1:
            raise ValueError(f"max_position must be a positive number of tokens or None, got {self.max_position}")
        self.noise_offsets_per_step = check_noise_offsets_per_step(self.noise_offsets_per_step, self.noise_max,
                                                                   self.noise_weights)  # noise_max and the weights too
        if not self.noisy_training and (self.noise_weights is not None or self.noise_offsets_per_step != 1):
            raise ValueError("noise_weights / noise_offsets_per_step choose the noise offsets of noisy training, "
                             "which noisy_training=False turns off (every step at j = 1): drop them or set "
                             "noisy_training=True")
        if self.target_sharding not in TARGET_SHARDING_MODES:
            raise ValueError(f"target_sharding must be one of {TARGET_SHARDING_MODES}, got {self.target_sharding!r}")
        if self.soft_labels_topk < 0:
            raise ValueError(f"soft_labels_topk must be >= 0 (0 = off, 8-32 typical), got {self.soft_labels_topk}")
        if not 0.0 <= self.soft_labels_weight <= 1.0:
            raise ValueError(f"soft_labels_weight must be in [0, 1] (1 = soft only), got {self.soft_labels_weight}")
        if self.draft_vocab_loss and self.soft_labels_topk == 0:
            raise ValueError("draft_vocab_loss=True computes the loss with the soft-label pass: set soft_labels_topk "
                             "(e.g. 16), or leave draft_vocab_loss off")
        if self.loss_chunk_size < 1:
            raise ValueError(f"loss_chunk_size must be >= 1, got {self.loss_chunk_size}")
        super().__post_init__()


# Values a plain `TrainingArguments` falls back to inside `LongSpecTrainer`.
LONGSPEC_DEFAULTS = {
    name: LongSpecTrainingArguments.__dataclass_fields__[name].default
    for name in (
        "anchor_offset", "anchor_sinks", "anchor_max_length", "max_position", "noisy_training", "noise_max",
        "noise_weights", "noise_offsets_per_step", "index_seed", "distill_labels", "soft_labels_topk",
        "soft_labels_weight", "draft_vocab_loss", "loss_chunk_size", "target_sharding",
    )
}
