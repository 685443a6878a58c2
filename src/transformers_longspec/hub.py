"""Model cards for saved LongSpec drafts, made with huggingface_hub's `ModelCard` from `model_cards/longspec_draft.md`.

`LongSpecDraft.save_pretrained` calls `write_model_card`, so every saved folder is ready for the Hub. The card is
filled from the draft's config (target, sizes, tree) and, when they sit in the folder (or in the folder the draft
was loaded from, whence they are copied along), from two records:

* `longspec_training.json`, written by `longspec train`: recipe, steps, losses, time, hardware;
* `longspec_eval.json`, written by `benchmarks/eval_lossless.py --out`: τ and the lossless check per dataset.

Reference: huggingface_hub `ModelCard.from_template`, `ModelCardData`; transformers model-card conventions.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from .checkpoint import saved_tensor_dtypes
from .configuration import hub_repo_id
from .model_cards import DRAFT_CARD_TEMPLATE

TRAINING_FILE = "longspec_training.json"
EVAL_FILE = "longspec_eval.json"
CARD_TAGS = ["speculative-decoding", "longspec", "draft-model", "transformers-longspec"]


def write_model_card(draft, folder, repo_id: str | None = None) -> Path:
    """Write `folder/README.md` for `draft`, copying its training/evaluation records into `folder` when missing.

    Args:
        draft: a `LongSpecDraft` (attached or not).
        folder: the saved draft's folder.
        repo_id: the Hub id named in the card's code snippets (default: the folder's name).
    Returns: the path of README.md.
    Reference: huggingface_hub `ModelCard.save`.
    """
    folder = Path(folder)
    source = Path(str(getattr(draft, "name_or_path", "") or ""))
    for name in (TRAINING_FILE, EVAL_FILE):
        if source.is_dir() and (source / name).is_file() and not (folder / name).exists():
            shutil.copyfile(source / name, folder / name)
    n_params = sum(p.numel() for p in draft.parameters())
    # the dtype of the weights in the folder (a trainer saves bf16 weights of an fp32 draft), else the draft's own
    dtype = _stored_dtype(folder) or str(next(draft.parameters()).dtype).removeprefix("torch.")
    card = draft_model_card(draft.config, n_params, dtype, repo_id or folder.resolve().name,
                            _read_json(folder / TRAINING_FILE), _read_json(folder / EVAL_FILE))
    path = folder / "README.md"
    card.save(path)
    return path


def draft_model_card(config, n_params: int, dtype: str, repo_or_path: str, training: dict | None = None,
                     evaluation: dict | None = None) -> ModelCard:
    """The model card of a draft.

    Args:
        config: the draft's `LongSpecConfig`.
        n_params: the draft's own parameter count. dtype: of the saved weights, e.g. "bfloat16".
        repo_or_path: Hub id or folder shown in the code snippets.
        training: the `longspec_training.json` record, if any. evaluation: the `longspec_eval.json` record, if any.
    Returns: `huggingface_hub.ModelCard` (YAML metadata: base_model when the target's Hub id is known, license,
        library, tags).
    Reference: huggingface_hub `ModelCard.from_template`.
    """
    base = hub_repo_id(config.target_name_or_path)
    data = ModelCardData(base_model=base, library_name="transformers", license="apache-2.0", tags=CARD_TAGS)
    return ModelCard.from_template(
        data,
        template_path=str(DRAFT_CARD_TEMPLATE),
        target_name=base.split("/")[-1] if base else f"a {config.target_model_type or 'decoder'} target",
        n_params=f"{n_params / 1e6:.1f} M" if n_params >= 10**6 else f"{n_params:,}",
        dtype=dtype,
        window=config.sliding_window,
        repo_or_path=repo_or_path,
        target=_target_text(config, base),
        training=_training_text(training),
        results=_results_text(evaluation, config),
    )


def _stored_dtype(folder: Path) -> str | None:
    """The floating dtype of the weights saved in `folder` ("bfloat16", ...), or None without readable weight files
    or with several floating dtypes in them."""
    try:
        stored = saved_tensor_dtypes(folder)
    except ValueError:
        return None
    names = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}
    dtypes = {names[d] for d in stored if d in names}
    return dtypes.pop() if len(dtypes) == 1 else None


def _read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _target_text(config, base: str | None) -> str:
    name = f"[{base}](https://huggingface.co/{base})" if base else "A target whose Hub id was not recorded"
    return (
        f"{name}: model_type `{config.target_model_type}`, {config.target_num_hidden_layers} layers, hidden size "
        f"{config.hidden_size}, {config.num_attention_heads} query / {config.num_key_value_heads} KV heads of "
        f"{config.head_dim}, vocabulary {config.vocab_size:,} tokens, context {config.max_position_embeddings:,} "
        f"tokens. Default tree (beam width per depth): {list(config.beam_widths)}. A target of other sizes is "
        "refused with an error naming the mismatch."
    )


def _recipe_description(name: str | None) -> str | None:
    if not name:
        return None
    from .trainers.recipes import RECIPE_DIR  # lazy: the training stack is slow to import

    path = RECIPE_DIR / f"{name}.json"
    return json.loads(path.read_text()).get("description") if path.is_file() else None


def _training_text(summary: dict | None) -> str:
    if not summary:
        return "Not recorded (`longspec train` writes `longspec_training.json` beside the weights)."
    recipe = summary.get("recipe")
    description = summary.get("recipe_description") or _recipe_description(recipe)
    init = summary.get("draft_init")
    start = ("a new draft initialised from the target's last layer" if init == "from_target"
             else str(init) if " " in str(init) else f"`{init}`")  # a path in code font, a description as text
    facts = [f"{summary.get('steps')} steps from {start}" + (" with LoRA" if summary.get("lora") else "")]
    losses = (("train loss", "train_loss"), ("eval loss", "eval_loss"))
    facts += [f"{label} {summary[key]:.2f}" for label, key in losses if isinstance(summary.get(key), (int, float))]
    if isinstance(summary.get("train_runtime_s"), (int, float)):
        device = summary.get("device", "an unrecorded device") + (" with bf16 autocast" if summary.get("bf16") else "")
        facts.append(f"{summary['train_runtime_s']:.0f} s of training on {device}")
    if summary.get("save_dtype"):
        facts.append(f"weights saved in {summary['save_dtype']}")
    return f"Recipe `{recipe}`" + (f": {description}" if description else ".") + f"\n\nThis draft: {'; '.join(facts)}."


def _results_text(evaluation: dict | None, config) -> str:
    rows = (evaluation or {}).get("rows") or []
    if not rows:
        return ("Not measured yet: run `python benchmarks/eval_lossless.py --target TARGET --draft FOLDER --out "
                "FOLDER/longspec_eval.json`, then save the draft again.")
    meta = evaluation.get("meta", {})
    if "tree" in meta and meta["tree"] is None:  # eval_lossless.py with no --tree: what a user gets
        shape = ("no tree named (the default-tree policy chose the tree and the retrieval branch, up to "
                 f"{meta.get('retrieval') or 0} tokens, from the device's measured costs)")
    else:
        retrieval = f" + a retrieval branch of {meta['retrieval']} tokens" if meta.get("retrieval") else ""
        shape = f"tree {meta.get('tree') or list(config.beam_widths)}{retrieval}"
    lines = [
        f"{meta.get('device', 'unrecorded device')}, {meta.get('dtype', '?')}, greedy, {shape}, "
        f"{meta.get('max_new_tokens', '?')} new tokens per prompt (torch {meta.get('torch', '?')}). τ = mean tokens "
        "emitted per target forward; identical = the output equals plain greedy decoding token for token.",
        "",
        "| dataset | prompts | prompt tokens | identical | τ mean (min–max) |",
        "|---|---|---|---|---|",
    ]
    for dataset in sorted({r.get("dataset", "?") for r in rows}):
        group = [r for r in rows if r.get("dataset", "?") == dataset]
        taus = [r.get("tau", 0.0) for r in group]
        tokens = [r.get("prompt_tokens", 0) for r in group]
        lines.append(f"| {dataset} | {len(group)} | {min(tokens):,}–{max(tokens):,} | "
                     f"{sum(bool(r.get('identical')) for r in group)}/{len(group)} | "
                     f"{sum(taus) / len(taus):.2f} ({min(taus):.2f}–{max(taus):.2f}) |")
    diverged = [r for r in rows if not r.get("identical")]
    if diverged:
        gaps = [r["top2_gap"] for r in diverged if r.get("top2_gap") is not None]
        lines += ["", f"{len(diverged)} prompt(s) diverged from plain greedy"
                  + (f"; the target's top-2 logit gap at the first divergence was at most {max(gaps):.3g}" if gaps
                     else "") + "."]
    return "\n".join(lines)


__all__ = ["write_model_card", "draft_model_card", "TRAINING_FILE", "EVAL_FILE"]
