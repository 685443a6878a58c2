"""`LongSpecTrainer`: train a LongSpec draft against a frozen target with the stock transformers `Trainer`.

Each step:

    positions = anchor_offset_position_ids(...)            # short sequences only (Alg. 1); else 0..seq-1
    j         = sample_noise_offset(noise_max)              # flash noisy training (Alg. 2); 1 = no noise
                                                            # (noise_offsets_per_step > 1: several j, mean loss)
    K, V      = target's last-layer KV cache at `positions` # frozen target, no_grad, decoder only (no LM head)
    labels    = the target's greedy next tokens             # only with distill_labels (self-distillation)
    loss      = draft(input_ids, K, V, position_ids=positions, labels=labels, noise_offset=j,
                      target_hidden=H).loss                 # H, the final hidden states (+ target_feature_layers'
                                                            # outputs): target_hidden_input only
    loss      = (1 - w) * loss + w * soft CE to the target's top-k   # only with soft_labels_topk (soft_labels.py)

Only `compute_loss` and `prediction_step` are overridden; batching, bf16 autocast, gradient accumulation,
logging, evaluation, checkpointing and resuming are the `Trainer`'s. The target is held on the trainer (never a
submodule of the draft), so optimizers and checkpoints only ever see draft weights; a checkpoint folder loads with
`LongSpecDraft.from_pretrained(folder, target_model=target)`. A PEFT (LoRA) wrapped draft trains the same way and
checkpoints its adapter (see `trainers/lora.py`).

Under `accelerate launch` the engine (FSDP, DeepSpeed, DDP) prepares the draft as it would any model; the trainer
shards the frozen target itself with FSDP2 when the run shards (`target_sharding`, see `trainers/sharding.py`),
keeping the embedding and LM head the draft shares whole on every process. `save_trained_draft` writes the final
draft from any engine as one folder. Configurations and commands: `trainers/distributed/README.md`.

Reference: LongSpec (arXiv 2502.17421) §3.2; transformers `Trainer.compute_loss` / `prediction_step`.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import Trainer, TrainingArguments
from transformers.utils import logging

from transformers_longspec.compat import layer_outputs
from transformers_longspec.modeling import LongSpecDraft

from .anchor_offset import anchor_offset_position_ids
from .arguments import LONGSPEC_DEFAULTS, LongSpecTrainingArguments
from .noisy import sample_noise_offsets
from .sharding import shard_target, target_is_sharded, wants_target_sharding
from .soft_labels import draft_vocab_loss_parts, require_draft_vocabulary, soft_distill_loss, target_topk

__all__ = ["LongSpecTrainer", "save_trained_draft", "target_greedy_labels", "target_last_layer_kv", "unwrap_draft"]

logger = logging.get_logger(__name__)


def target_last_layer_kv(target, input_ids, position_ids, attention_mask=None, return_hidden: bool = False,
                         feature_layers=()):
    """Run the frozen target's decoder (no LM head) and return its last layer's KV cache.

    Args:
        target: the target `*ForCausalLM`.
        input_ids: (batch, seq) int64.
        position_ids: (batch, seq) int64, e.g. anchor-offset ids; the draft must get the same ones.
        attention_mask: (batch, seq) int64 (1 = token, 0 = right padding); None = all ones. Always passed
            explicitly: without it transformers reads position-id jumps (anchor-offset!) as packed sequences and
            would hide the attention sinks from the later tokens.
        return_hidden: also return the decoder's final (normed) hidden states (batch, seq, hidden).
        feature_layers: with `return_hidden`, decoder layers whose outputs follow the final states on the last axis
            (a draft's `config.target_feature_layers`): hidden is then (batch, seq, hidden x (1 + len)), the
            draft's `target_hidden` input.
    Returns: (keys, values), each (batch, n_kv_heads, seq, head_dim) in the target's dtype, post-RoPE, no grad;
        (keys, values, hidden) with `return_hidden`.
    Reference: LongSpec §3.2 (the draft is trained on the target's own KV cache); transformers `DynamicCache`.
    """
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if feature_layers and not return_hidden:
        raise ValueError("feature_layers join the final hidden states: pass return_hidden=True with them")
    with torch.no_grad(), layer_outputs(target, tuple(feature_layers or ())) as features:
        out = target.get_decoder()(
            input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, use_cache=True
        )
        hidden = torch.cat([out.last_hidden_state, *features], dim=-1) if features else out.last_hidden_state
    cache = out.past_key_values if "past_key_values" in out else out["cache"]  # renamed `cache` in transformers 5.24
    layer = cache.layers[-1]
    return (layer.keys, layer.values, hidden) if return_hidden else (layer.keys, layer.values)


def target_greedy_labels(target, hidden: torch.Tensor, labels: torch.Tensor, chunk: int = 512) -> torch.Tensor:
    """Self-distillation labels: at every supervised position, the target's own greedy next token.

    Greedy speculative decoding accepts a draft token exactly when it equals the target's argmax, so training on
    these labels optimises acceptance directly (the text's next token differs from the target's choice wherever the
    target would not have written the text). The LM head runs in chunks of `chunk` positions under no_grad.

    Args:
        target: the target `*ForCausalLM` (its `lm_head` is used).
        hidden: (batch, seq, hidden), the decoder's final hidden states (`target_last_layer_kv(return_hidden=True)`).
        labels: (batch, seq) int64 in transformers' unshifted convention (-100 = not supervised).
    Returns: (batch, seq) int64: position t + 1 holds argmax of the target's logits at t; -100 where `labels` is
        -100 and at position 0.
    Reference: greedy acceptance rule (Leviathan et al., 2023); self-distillation as in Medusa-2 / EAGLE.
    """
    greedy = torch.full_like(labels, -100)
    with torch.no_grad():
        for start in range(0, hidden.shape[1] - 1, chunk):
            end = min(start + chunk, hidden.shape[1] - 1)
            greedy[:, start + 1 : end + 1] = target.lm_head(hidden[:, start:end]).argmax(-1)
    return greedy.masked_fill(labels == -100, -100)


def unwrap_draft(model) -> LongSpecDraft:
    """The `LongSpecDraft` inside `model` (itself, or the base model of a PEFT wrapper).

    Raises: TypeError if `model` is not a draft (build one with `LongSpecDraft.from_target(target)`).
    Reference: peft `PeftModel.get_base_model`.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") and hasattr(model, "peft_config") else model
    if not isinstance(base, LongSpecDraft):
        raise TypeError(
            f"LongSpecTrainer trains a LongSpecDraft (optionally wrapped by peft), got {type(base).__name__}; "
            "build one with LongSpecDraft.from_target(target) or "
            "LongSpecDraft.from_pretrained(path, target_model=target)"
        )
    return base


class LongSpecTrainer(Trainer):
    """`Trainer` for a LongSpec draft; the frozen target supplies the KV cache the draft reads.

    Args:
        model: the draft (`LongSpecDraft`, or a PEFT model wrapping one).
        args: `LongSpecTrainingArguments` (a plain `TrainingArguments` gets the LongSpec defaults and
            `remove_unused_columns=False`, with a warning if it was True).
        target_model: the target `*ForCausalLM` the draft was built for. It is put in eval mode, frozen and cast to
            bf16 / fp16 when `args.bf16` / `args.fp16` (else it keeps its dtype), in place; then either sharded over
            the processes (`args.target_sharding`: under FSDP or DeepSpeed ZeRO-3 by default) or moved whole to
            `args.device`. Load it on the CPU for a sharded run: layers reach the GPU one shard at a time.
        **kwargs: the other `Trainer` arguments (`train_dataset`, `eval_dataset`, `data_collator`, `callbacks`, ...).
            Batches need `input_ids` (batch, seq) int64 and may carry `labels` (-100 = ignored), `attention_mask`
            (right padding only) and `position_ids` (used as given, e.g. for long documents).
    Raises: ValueError if `target_model` is missing, was partitioned by DeepSpeed's `zero.Init`, or, without
        bf16/fp16 autocast, has another dtype than the draft, or if `draft_vocab_loss` is on for a draft without a
        vocabulary of its own; TypeError if `model` is not a draft.
    Reference: LongSpec §3.2; transformers `Trainer`.
    """

    def __init__(self, model=None, args: TrainingArguments | None = None, target_model=None, **kwargs):
        if target_model is None:
            raise ValueError(
                "LongSpecTrainer needs the frozen target: LongSpecTrainer(model=draft, target_model=target, ...)"
            )
        if model is None:
            raise ValueError("LongSpecTrainer needs the draft to train: model=LongSpecDraft.from_target(target)")
        args = args if args is not None else LongSpecTrainingArguments(output_dir="trainer_output")
        if args.remove_unused_columns:
            logger.warning("LongSpecTrainer: setting remove_unused_columns=False (the collators read raw columns)")
            args.remove_unused_columns = False
        draft = unwrap_draft(model)
        if getattr(args, "draft_vocab_loss", False):
            require_draft_vocabulary(draft)  # before any model work
        target_model = _freeze_target(target_model, args, draft)
        if draft.target_model is not target_model:
            draft.attach_target(target_model)
        super().__init__(model=model, args=args, **kwargs)
        self.target_model = target_model
        self._place_target()
        self._draw_step, self._draw_micro = -1, 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Draft next-token loss on the target's KV cache for one (micro-)batch.

        In training mode the position ids are anchor-offset (sequences shorter than `anchor_max_length`) and the
        noise offsets j are drawn in [1, noise_max] (`noise_offsets_per_step` of them, uniformly or by
        `noise_weights`; the loss is their mean over one target pass); in eval mode positions are 0..seq-1 and j = 1,
        so evaluation losses are comparable across runs. `num_items_in_batch` is unused: the draft returns a
        per-batch mean and the Trainer divides by the accumulation steps (`LongSpecDraft.accepts_loss_kwargs =
        False`).

        Args:
            model: the (possibly wrapped) draft.
            inputs: dict with `input_ids` (batch, seq) int64 and optional `labels`, `attention_mask`, `position_ids`.
            return_outputs: also return the `LongSpecDraftOutput`.
            num_items_in_batch: ignored (see above).
        Returns: () fp32 loss, or (loss, outputs).
        Reference: LongSpec §3.2, Alg. 1-2; transformers `Trainer.compute_loss`.
        """
        input_ids = inputs["input_ids"]
        attention_mask = inputs.get("attention_mask")
        labels = inputs.get("labels")
        if labels is None:
            labels = input_ids if attention_mask is None else input_ids.masked_fill(attention_mask == 0, -100)
        training = model.training
        generator = self._index_generator() if training else None
        position_ids = inputs.get("position_ids")
        if position_ids is None:
            position_ids = self._position_ids(input_ids, generator)
        offsets = [1]
        if training and self._option("noisy_training"):
            offsets = sample_noise_offsets(self._option("noise_max"), self._option("noise_offsets_per_step"),
                                           generator, self._option("noise_weights"))
        keys, values, hidden, labels, top = self._target_pass(input_ids, position_ids, attention_mask, labels)
        targets = self._loss_targets(model, input_ids, labels, top)  # the same for every offset
        losses = [self._draft_loss(model, input_ids, position_ids, keys, values, hidden, targets, j)
                  for j in offsets]  # every offset reads the same target pass
        outputs = losses[-1]
        outputs["loss"] = sum(o.loss for o in losses) / len(losses)
        loss = outputs.loss  # stays in the graph (zero) when a batch has no supervised token
        if training and not bool((labels[:, 1:] != -100).any()):
            logger.warning_once("LongSpecTrainer: a batch has no supervised tokens (all labels -100); check the data")
        return (loss, outputs) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Evaluation loss only (the draft's hidden states are not logits; nothing else is gathered).

        Returns: (() fp32 loss, None, None).
        Reference: transformers `Trainer.prediction_step`.
        """
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    # ------------------------------------------------------------------ helpers (not Trainer hooks)
    def _loss_targets(self, model, input_ids, labels, top):
        """(LM head, (top logits, top ids, labels)) for `soft_distill_loss`: the target's whole vocabulary with its
        top-k, or (None, None, labels) without soft labels (`top` None: the hard loss alone); with `draft_vocab_loss`
        the draft's vocabulary + the batch's tokens."""
        if top is None:
            return unwrap_draft(model).lm_logits, (None, None, labels)
        if self._option("draft_vocab_loss"):
            return draft_vocab_loss_parts(unwrap_draft(model), input_ids, *top, labels)
        return unwrap_draft(model).lm_logits, (*top, labels)

    def _draft_loss(self, model, input_ids, position_ids, keys, values, hidden, targets, noise: int):
        """The draft's `LongSpecDraftOutput` at noise offset `noise`, its loss from `soft_distill_loss` on `targets` =
        (LM head, (top logits, top ids, labels)): the hard + soft loss, or the hard loss alone without top-k (the same
        value as the draft's own `forward(labels=...)` loss, through the fused LSE cross-entropy)."""
        outputs = model(
            input_ids=input_ids, target_keys=keys, target_values=values, position_ids=position_ids,
            noise_offset=noise, target_hidden=hidden if unwrap_draft(model).config.target_hidden_input else None,
        )
        lm_logits, (top_logits, top_ids, labels) = targets
        outputs["loss"] = soft_distill_loss(lm_logits, outputs.hidden_states, top_logits, top_ids, labels, noise,
                                            self._option("loss_chunk_size"), self._option("soft_labels_weight"))
        return outputs

    def _target_pass(self, input_ids, position_ids, attention_mask, labels):
        """The frozen target's last-layer K/V, final hidden states, the labels to train on, and its top-k (soft
        distillation) or None.

        One decoder pass; the LM head runs once more only when `distill_labels` or `soft_labels_topk` asks for it
        (with both, the argmax labels are the first of the top-k).
        Returns: (keys, values, hidden (batch, seq, the draft's config.target_feature_size): the final states, then
            the draft's feature layers' outputs; labels (batch, seq) int64, (top logits, top ids) each (batch, seq, k)
            or None).
        """
        distill, topk = self._option("distill_labels"), self._option("soft_labels_topk")
        config = unwrap_draft(self.model).config
        keys, values, features = target_last_layer_kv(self.target_model, input_ids, position_ids, attention_mask,
                                                      return_hidden=True,
                                                      feature_layers=config.target_feature_layers or ())
        hidden = features[..., : config.hidden_size]  # the final states: what the target's LM head reads
        if not distill and not topk:
            return keys, values, features, labels, None
        top = target_topk(self.target_model, hidden, topk) if topk else None
        if distill and top is not None:
            greedy = torch.full_like(labels, -100)
            greedy[:, 1:] = top[1][:, :-1, 0]
            labels = greedy.masked_fill(labels == -100, -100)
        elif distill:
            labels = target_greedy_labels(self.target_model, hidden, labels)
        return keys, values, features, labels, top

    def _place_target(self) -> None:
        """Shard the target over the processes (`trainers/sharding.py`) or move a whole copy to `args.device`.

        Runs in `__init__`, after the `Trainer` made its accelerator and before the engine prepares the draft (in
        `train` / `evaluate`), so engines that look for the draft's input embedding find an FSDP unit and skip it.
        """
        target = self.target_model
        if target_is_sharded(target):
            return
        plugin = getattr(self.accelerator.state, "deepspeed_plugin", None)
        zero3 = plugin is not None and plugin.zero_stage == 3
        if any(hasattr(p, "ds_id") for p in target.parameters()):
            raise ValueError(
                "the target was partitioned by DeepSpeed's zero.Init while loading; set zero3_init_flag: false in the "
                "accelerate config (trainers/distributed/deepspeed_zero3.yaml) so LongSpecTrainer can shard it"
            )
        if wants_target_sharding(self._option("target_sharding"), self.args.world_size, self.is_fsdp_enabled, zero3):
            shard_target(target, self.args.device)
        else:
            target.to(self.args.device)

    def _option(self, name: str):
        """A LongSpec option from `self.args`, or its default for a plain `TrainingArguments`."""
        return getattr(self.args, name, LONGSPEC_DEFAULTS[name])

    def _position_ids(self, input_ids: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """(batch, seq) int64: anchor-offset ids when training on short sequences, else 0..seq-1."""
        batch, seq = input_ids.shape
        if generator is not None and self._option("anchor_offset") and seq < self._option("anchor_max_length"):
            max_position = self._option("max_position")
            max_position = max_position or self.target_model.config.get_text_config().max_position_embeddings
            return anchor_offset_position_ids(
                seq, max_position, self._option("anchor_sinks"), generator, batch, input_ids.device
            )
        return torch.arange(seq, device=input_ids.device).expand(batch, seq)

    def _index_generator(self) -> torch.Generator:
        """CPU generator for this micro-step, seeded from (index_seed, process, global step, micro-step).

        Deriving the seed from the step (instead of one running generator) makes a resumed run draw exactly what
        an uninterrupted run would have drawn.
        """
        step = self.state.global_step
        self._draw_micro = self._draw_micro + 1 if step == self._draw_step else 0
        self._draw_step = step
        seed = self._option("index_seed")
        seed = self.args.seed if seed is None else seed
        entropy = [abs(int(seed)), self.args.process_index, step, self._draw_micro]
        state = np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0]
        return torch.Generator().manual_seed(int(state))


def save_trained_draft(trainer: LongSpecTrainer, output_dir, dtype: torch.dtype | None = None) -> None:
    """Write the trained draft as one `from_pretrained` folder, whatever engine trained it (call on every process).

    The full draft state dict is gathered from the engine (FSDP shards, a DeepSpeed ZeRO-3 partition, DDP, or one
    process: `Accelerator.get_state_dict`, a collective where weights are sharded) and the main process writes
    `config.json` + `model.safetensors`: draft tensors only, loadable with
    `LongSpecDraft.from_pretrained(output_dir, target_model=target)` on one GPU or on the CPU.

    Args:
        trainer: the `LongSpecTrainer` after `train()`.
        output_dir: folder to write (created if missing).
        dtype: cast floating tensors to this dtype in the file (e.g. torch.bfloat16); None keeps the trained dtype.
    Raises: TypeError for a PEFT-wrapped draft (save its adapter, or merge it with `merge_lora_draft` first).
    Reference: accelerate `Accelerator.get_state_dict`; transformers `PreTrainedModel.save_pretrained`.
    """
    model = trainer.accelerator.unwrap_model(trainer.model)
    if not isinstance(model, LongSpecDraft):
        raise TypeError(f"save_trained_draft writes a plain LongSpecDraft, got {type(model).__name__}; save a PEFT "
                        "draft's adapter with save_pretrained or merge it first (merge_lora_draft)")
    state = trainer.accelerator.get_state_dict(trainer.model_wrapped)
    if trainer.is_world_process_zero():
        if dtype is not None:
            state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        model.save_pretrained(output_dir, state_dict=state)
        # config.json names the class (FSDP2 renames it FSDPLongSpecDraft) and the dtype of the file
        trained = model.config.dtype
        model.config.architectures = [LongSpecDraft.__name__]
        if dtype is not None:
            model.config.dtype = str(dtype).removeprefix("torch.")
        model.config.save_pretrained(output_dir)
        model.config.dtype = trained
    trainer.accelerator.wait_for_everyone()


def _freeze_target(target, args: TrainingArguments, draft: LongSpecDraft):
    """Eval mode, no grads, bf16/fp16 under mixed precision (placed later); check dtypes against the draft."""
    dtype = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else next(target.parameters()).dtype
    target.eval().requires_grad_(False)
    target.to(dtype=dtype)
    draft_dtype = next(draft.parameters()).dtype
    if not (args.bf16 or args.fp16) and draft_dtype != dtype:
        raise ValueError(
            f"the target is {dtype} and the draft {draft_dtype}; without autocast both must match. Set bf16=True "
            "(mixed precision: fp32 draft weights, bf16 target) or cast them to one dtype"
        )
    if (args.bf16 or args.fp16) and draft_dtype != torch.float32:
        logger.warning(
            f"the draft's weights are {draft_dtype}: AdamW updates on half-precision weights lose small steps; "
            "keep the draft in fp32 (draft.float()) and let bf16=True autocast the compute"
        )
    return target
