"""LoRA domain adaptation of a trained LongSpec draft (optional dependency: `peft`).

    draft = LongSpecDraft.from_pretrained(path, target_model=target)
    model = add_lora_to_draft(draft, r=16)                        # peft.PeftModel; only the adapters train
    LongSpecTrainer(model=model, target_model=target, ...).train()   # checkpoints hold the adapter only
    draft = merge_lora_draft(model)                               # a plain LongSpecDraft again
    target.generate(ids, assistant_model=draft)                   # pass the MERGED draft (the generate hook
                                                                  # recognises LongSpecDraft, not PeftModel)

Reference: LoRA (Hu et al. 2021); peft `get_peft_model`, `PeftModel.from_pretrained`, `merge_and_unload`.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers_longspec.modeling import LongSpecDraft

__all__ = ["LORA_TARGET_MODULES", "add_lora_to_draft", "load_lora_draft", "merge_lora_draft"]

# Every linear layer of the draft block (the cross-attention has q_proj/o_proj only; k/v come from the target).
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _peft():
    try:
        import peft
    except ImportError as err:
        raise ImportError("LoRA adaptation of a draft needs peft: pip install peft") from err
    return peft


def add_lora_to_draft(draft: LongSpecDraft, r: int = 16, alpha: int = 32, dropout: float = 0.0,
                      target_modules: Sequence[str] = LORA_TARGET_MODULES):
    """Wrap a draft with LoRA adapters; the draft's own weights are frozen.

    Args:
        draft: an attached `LongSpecDraft` (e.g. a published one loaded with `from_pretrained(..., target_model=)`).
        r: LoRA rank.
        alpha: LoRA scaling numerator (the update is scaled by alpha / r).
        dropout: dropout on the LoRA input.
        target_modules: module names to adapt (default: every linear layer of the block).
    Returns: `peft.PeftModel` wrapping the draft; train it with `LongSpecTrainer` like a draft.
    Raises: ImportError naming `pip install peft` if peft is missing; TypeError if `draft` is not a LongSpecDraft.
    Reference: LoRA (Hu et al. 2021); peft `get_peft_model`.
    """
    if not isinstance(draft, LongSpecDraft):
        raise TypeError(f"add_lora_to_draft expects a LongSpecDraft, got {type(draft).__name__}")
    peft = _peft()
    config = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules))
    return peft.get_peft_model(draft, config)


def merge_lora_draft(peft_model) -> LongSpecDraft:
    """Fold the LoRA updates into the draft's weights and drop the wrapper.

    Args:
        peft_model: a `peft.PeftModel` around a `LongSpecDraft` (from `add_lora_to_draft` or `load_lora_draft`).
    Returns: the `LongSpecDraft` (still attached to its target), usable as `assistant_model=` and savable with
        `save_pretrained` like any draft.
    Raises: TypeError if the wrapped model is not a LongSpecDraft.
    Reference: peft `LoraModel.merge_and_unload`.
    """
    merged = peft_model.merge_and_unload()
    if not isinstance(merged, LongSpecDraft):
        raise TypeError(f"merge_lora_draft expects a PEFT-wrapped LongSpecDraft, got {type(merged).__name__}")
    return merged


def load_lora_draft(draft: LongSpecDraft, adapter_path: str, merge: bool = True):
    """Load a LoRA adapter saved by `LongSpecTrainer` (or `PeftModel.save_pretrained`) onto a draft.

    Args:
        draft: the attached base draft the adapter was trained on.
        adapter_path: folder with `adapter_config.json` and `adapter_model.safetensors`.
        merge: merge the adapter and return a plain `LongSpecDraft` (else the `PeftModel`).
    Returns: `LongSpecDraft` if `merge`, else `peft.PeftModel`.
    Raises: ImportError naming `pip install peft` if peft is missing.
    Reference: peft `PeftModel.from_pretrained`.
    """
    model = _peft().PeftModel.from_pretrained(draft, adapter_path)
    return merge_lora_draft(model) if merge else model
