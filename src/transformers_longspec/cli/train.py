"""`longspec train`: train (or LoRA-adapt) a LongSpec draft for a target from a recipe.

    longspec train --recipe stage1 --target smollm2 --output drafts/smollm2-stage1
    longspec train --recipe stage2 --target ./Qwen2.5-Coder-1.5B --draft drafts/q-stage1 --output drafts/q-stage2
    longspec train --recipe stage3 --target model.gguf --draft drafts/q-stage2 --lora --output drafts/q-code
    longspec data --recipe qwen2.5-coder-1.5b-mix --target model.gguf --set-mix rows_cache=rows.pt  # scan once

The main CLI calls `add_train_parser(subparsers)` / `add_data_parser(subparsers)` to register the commands and
`run_train(args)` / `run_data(args)` to run them.
Progress bars and loss logs come from the transformers `Trainer`. User mistakes raise ValueError /
FileNotFoundError / ImportError with the fix in the message (the CLI prints them without a traceback).

Reference: LongSpec (arXiv 2502.17421) §4.1; trainers/recipes/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from .models import check_draft_option, load_target, load_tokenizer

__all__ = ["add_data_parser", "add_train_parser", "run_data", "run_train"]


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `train` subcommand to an `argparse` subparsers object (sets `func=run_train`).

    Args:
        subparsers: the object returned by `ArgumentParser.add_subparsers()`.
    Returns: the `train` sub-parser.
    Reference: Python `argparse`.
    """
    p = subparsers.add_parser(
        "train", help="train a LongSpec draft for a target from a recipe",
        description="Train a new LongSpec draft for a target model, continue training a saved one (--draft), or adapt "
        "one to a domain with LoRA (--draft ... --lora). A recipe is a JSON file of data and training settings; "
        "shipped ones: stage1 (short text), stage2 (long context), stage3 (chat / task), smollm2-mix and "
        "qwen2.5-coder-1.5b-mix (the mixed builder behind the bundled drafts), smollm2-gpu, qwen2.5-coder-1.5b-gpu, "
        "-distill, -ablation (see trainers/recipes/README.md). Progress bars and "
        "losses come from the transformers Trainer; the final draft and its model card are saved to --output.",
        epilog="example: longspec train --recipe stage1 --target smollm2 --output drafts/smollm2 --max-steps 50. "
        "For a few minutes on a CPU: ... --max-steps 3 --set per_device_train_batch_size=1 --set-data max_sequences=8 "
        "--set-data eval_sequences=0 (no evaluation rows: evaluation is the slow part on a CPU)",
    )
    p.add_argument("--target", required=True, metavar="MODEL",
                   help="the model the draft serves: 'smollm2' (the embedded SmolLM2-135M-Instruct), a Hugging Face "
                   "model folder, or a .gguf file")
    p.add_argument("--recipe", required=True, metavar="NAME_OR_JSON",
                   help="a shipped recipe name (stage1, stage2, stage3, smollm2-mix, qwen2.5-coder-1.5b-mix, ...) "
                   "or a recipe .json file")
    p.add_argument("--output", required=True, metavar="FOLDER", help="folder for checkpoints and the final draft")
    p.add_argument("--max-steps", type=int, default=None, metavar="N", help="override the recipe's max_steps")
    p.add_argument("--max-minutes", type=float, default=None, metavar="M",
                   help="stop training after M minutes of steps (data building not counted) and save the draft "
                   "as at max_steps; the learning-rate schedule advances with the clock too (it ends when M does "
                   "if the steps fall behind max_steps)")
    p.add_argument("--draft", default=None, metavar="FOLDER",
                   help="continue from this saved draft (a folder, or a compact file of draft.save_compact) instead "
                        "of building a new one from the target; a recipe's draft section may add "
                        "target_feature_layers it lacks or widen its MLP (a larger intermediate_size)")
    p.add_argument("--lora", action="store_true", help="LoRA-adapt the --draft (needs peft) instead of full training")
    p.add_argument("--lora-r", type=int, default=16, metavar="R", help="LoRA rank (default 16)")
    p.add_argument("--lora-alpha", type=int, default=32, metavar="ALPHA",
                   help="LoRA alpha; updates are scaled by alpha / r (default 32)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where to train (auto: cuda if available)")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto",
                   help="compute dtype; auto = the recipe's bf16 on CUDA, fp32 on CPU (draft weights stay fp32)")
    p.add_argument("--save-dtype", choices=["fp32", "bf16"], default="fp32",
                   help="dtype of the saved final draft (bf16 halves the file; loading casts to the target's dtype)")
    p.add_argument("--seed", type=int, default=None, help="override the recipe's seed")
    p.add_argument("--resume", action="store_true", help="resume from the last checkpoint in --output")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a training argument, e.g. --set learning_rate=1e-4 (JSON values where possible)")
    _add_data_options(p)
    p.set_defaults(func=run_train)
    return p


def _add_data_options(p) -> None:
    p.add_argument("--set-data", action="append", default=[], metavar="KEY=VALUE",
                   help="override a data setting of the recipe, e.g. --set-data max_sequences=64")
    p.add_argument("--set-mix", action="append", default=[], metavar="KEY=VALUE",
                   help="override a mixed-data setting (data.mix) of the recipe, e.g. --set-mix short_rows=4096 or "
                   "--set-mix rows_cache=rows.pt (reuse the rows `longspec data` built)")


def add_data_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `data` subcommand (sets `func=run_data`): build a mixed-data recipe's short and long rows once.

    Args:
        subparsers: the object returned by `ArgumentParser.add_subparsers()`.
    Returns: the `data` sub-parser.
    Reference: Python `argparse`; `trainers/mix.py`.
    """
    p = subparsers.add_parser(
        "data", help="scan the corpus and tokenize a mixed-data recipe's rows into its rows_cache",
        description="Build the short and long rows of a recipe with data.source 'mix' (code of several languages and "
        "prose from the installed packages, long rows) with only the target's tokenizer, into the file "
        "data.mix.rows_cache; `longspec train` with the same recipe and rows_cache then skips the scan. With --chat, "
        "load the target instead and generate its chat self-distillation answers into data.mix.chat_cache, which "
        "`longspec train` then reads (else it generates them itself). With --prompts, render the chat prompts (the "
        "documents they quote, the chat template) into data.mix.chat_prompts_cache with the tokenizer alone, on the "
        "CPU, for --chat and `longspec train` to read.",
        epilog="example: longspec data --recipe qwen2.5-coder-1.5b-mix --target ./qwen15 --set-mix rows_cache=rows.pt",
    )
    p.add_argument("--target", required=True, metavar="MODEL",
                   help="the model the draft serves (only its tokenizer is loaded, but the whole model with --chat): "
                   "'smollm2', a model folder or a .gguf file")
    p.add_argument("--recipe", required=True, metavar="NAME_OR_JSON", help="a recipe with data.source 'mix'")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--chat", action="store_true",
                      help="instead, load the target and generate its chat self-distillation answers into "
                      "data.mix.chat_cache (on a GPU: batched greedy generation)")
    what.add_argument("--prompts", action="store_true",
                      help="instead, render the chat self-distillation prompts into data.mix.chat_prompts_cache "
                      "(tokenizer only)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where --chat generates (used with --chat only)")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto",
                   help="the target's dtype for --chat (used with --chat only; spelled as in `longspec train`); "
                   "auto = bf16 on CUDA, fp32 on CPU (bf16 is several times faster on CPUs with bf16 matrix units; "
                   "the answers may differ from fp32 ones at near-ties)")
    _add_data_options(p)
    p.set_defaults(func=run_data)
    return p


def run_data(args) -> dict:
    """Run `longspec data`: the recipe's short and long rows into `data.mix.rows_cache`, its chat prompts into
    `data.mix.chat_prompts_cache` (`--prompts`) or the target's answers into `data.mix.chat_cache` (`--chat`); see
    `add_data_parser`.

    Returns: the scan's statistics {"documents", "skipped_evaluation", "duplicates", "files_seen", "build_s"} and the
        cache file under its option's name.
    Raises: ValueError for a recipe without mixed data, without the cache option, or (`--prompts`) without chat
        prompts (the message gives the option).
    """
    from transformers_longspec.trainers.corpus import CorpusStats
    from transformers_longspec.trainers.mix import MixSpec, chat_prompt_ids, chat_rows, short_and_long_rows
    from transformers_longspec.trainers.recipes import load_recipe

    recipe = _with_data_overrides(load_recipe(args.recipe), args.set_data, args.set_mix)
    cache = "chat_cache" if args.chat else "chat_prompts_cache" if args.prompts else "rows_cache"
    if recipe.data.source != "mix":
        raise ValueError(f"longspec data builds a recipe with data.source 'mix' into data.mix.{cache}, and recipe "
                         f"{recipe.name!r} has {recipe.data.source!r}: use such a recipe (e.g. "
                         f"qwen2.5-coder-1.5b-mix) and add --set-mix {cache}=FILE")
    if not (recipe.data.mix or {}).get(cache):
        raise ValueError(f"longspec data{' --chat' if args.chat else ' --prompts' if args.prompts else ''} writes "
                         f"data.mix.{cache}, which recipe {recipe.name!r} leaves unset: add --set-mix {cache}=FILE")
    start, stats, spec = time.perf_counter(), CorpusStats.empty(), MixSpec(**recipe.data.mix)
    if args.chat:
        device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        bf16 = {"bf16": True, "fp32": False}.get(args.dtype, device == "cuda")
        target, tokenizer = load_target(args.target, torch.bfloat16 if bf16 else torch.float32, device)
        built = f"{len(chat_rows(spec, tokenizer, target, stats))} chat rows"
    elif cache == "chat_prompts_cache":
        if not (spec.chat_prompts or spec.chat_parts_prompts or spec.chat_long_prompts):
            raise ValueError("longspec data --prompts renders the chat prompts, and this recipe asks for none: set "
                             "--set-mix chat_prompts=N (or chat_long_prompts / chat_parts_prompts)")
        groups = chat_prompt_ids(spec, load_tokenizer(args.target), stats)
        built = f"{sum(len(p) for rounds in groups.values() for p in rounds)} chat prompts"
    else:
        short, long_rows = short_and_long_rows(spec, load_tokenizer(args.target), stats)
        built = f"{len(short)} short and {len(long_rows)} long rows"
    summary = {**dataclasses.asdict(stats), "build_s": round(time.perf_counter() - start, 1),
               cache: getattr(spec, cache)}
    print(f"longspec data: {built} -> {summary[cache]}: "
          + json.dumps({k: v for k, v in summary.items() if k != cache}))
    return summary


def _check_train_args(args) -> None:
    """Mistakes visible before the recipe, target or data load."""
    if args.lora and not args.draft:
        raise ValueError("--lora adapts a trained draft: pass --draft PATH (or drop --lora to train a new draft)")
    if args.draft:
        check_draft_option(args.draft)
    for name in ("max_steps", "lora_r", "lora_alpha"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.max_minutes is not None and not args.max_minutes > 0:
        raise ValueError(f"--max-minutes must be > 0, got {args.max_minutes}")
    if Path(args.output).is_file():
        raise ValueError(f"--output {args.output!r} is a file; give a folder (it is created if needed)")


_SET_EXAMPLES = {"--set": "learning_rate=1e-4", "--set-data": "max_sequences=64", "--set-mix": "short_rows=2000"}


def _parse_sets(pairs: list[str], flag: str = "--set") -> dict:
    """`KEY=VALUE` strings of option `flag` → dict; values parsed as JSON when possible (numbers, true/false, lists),
    and Python's True / False too (a string "False" would count as true)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} expects KEY=VALUE (e.g. {flag} {_SET_EXAMPLES[flag]}), got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = {"True": True, "False": False}.get(value, value)
    return out


def _with_data_overrides(recipe, pairs: list[str], mix_pairs: list[str] = ()):
    """The recipe with `--set-data KEY=VALUE` applied to its data section and `--set-mix KEY=VALUE` to its data.mix
    (validated again by `DataSpec` / `MixSpec`)."""
    if not pairs and not mix_pairs:
        return recipe
    overrides = _parse_sets(pairs, "--set-data")
    allowed = {f.name for f in dataclasses.fields(recipe.data)}
    unknown = sorted(set(overrides) - allowed)
    if unknown:
        raise ValueError(f"--set-data: unknown data settings {unknown}; allowed: {sorted(allowed)}")
    if mix_pairs:
        if recipe.data.source != "mix":
            raise ValueError(f"--set-mix changes data.mix, but recipe {recipe.name!r} has data.source "
                             f"{recipe.data.source!r}; use --set-data, or a recipe with mixed data")
        overrides["mix"] = {**(recipe.data.mix or {}), **_parse_sets(mix_pairs, "--set-mix")}
    return dataclasses.replace(recipe, data=dataclasses.replace(recipe.data, **overrides))


def _training_overrides(args, recipe) -> tuple[dict, str, bool]:
    """TrainingArguments overrides from the command line, the device and whether bf16 autocast is on."""
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda but no CUDA device is visible; use --device cpu")
    recipe_bf16 = device == "cuda" and bool(recipe.training_arguments.get("bf16", False))
    bf16 = {"bf16": True, "fp32": False}.get(args.dtype, recipe_bf16)
    overrides = {"use_cpu": device == "cpu", "bf16": bf16, **_parse_sets(args.set)}
    if args.max_steps is not None:
        overrides["max_steps"] = args.max_steps
    if args.seed is not None:
        overrides["seed"] = args.seed
    return overrides, device, overrides["bf16"]


def _build_model(args, recipe, target):
    """The model to train: a new draft, a continued draft (given the recipe's `target_feature_layers` when it has
    none: `LongSpecDraft.add_target_features`; widened to the recipe's larger `intermediate_size`:
    `LongSpecDraft.widen_mlp`), or a LoRA-wrapped draft (fp32 weights)."""
    from transformers_longspec.modeling import LongSpecDraft
    from transformers_longspec.trainers import add_lora_to_draft

    if args.draft:  # checked in _check_train_args before anything loaded
        draft = LongSpecDraft.from_pretrained(args.draft, target_model=target, dtype=torch.float32)
        layers = recipe.draft.get("target_feature_layers")
        if layers and not draft.config.target_feature_layers:  # a recipe that adds feature layers to a trained draft
            if args.lora:
                raise ValueError(f"the recipe adds target_feature_layers {layers} to --draft, whose new projection a "
                                 "LoRA adapter would not train: drop --lora, or drop target_feature_layers from the "
                                 "recipe's draft section")
            draft.add_target_features(layers)
        elif layers and draft.config.target_feature_layers != draft.config._checked_feature_layers(layers):
            raise ValueError(f"--draft reads target layers {draft.config.target_feature_layers}, the recipe asks for "
                             f"{layers}; drop target_feature_layers from the recipe's draft section or train a new "
                             "draft (no --draft)")
        width = recipe.draft.get("intermediate_size")
        if width is not None and width != draft.config.intermediate_size:  # the recipe widens a trained draft
            if width < draft.config.intermediate_size or args.lora:
                raise ValueError(f"--draft has an MLP {draft.config.intermediate_size} wide, the recipe asks for "
                                 f"{width}: a recipe may widen a continued draft (not with --lora), never narrow it; "
                                 "drop intermediate_size from the recipe's draft section or train a new draft")
            draft.widen_mlp(width)
    else:  # a draft vocabulary is set from the data once it is built (`_set_draft_vocabulary`)
        draft = LongSpecDraft.from_target(target, **{k: v for k, v in recipe.draft.items() if k != "draft_vocab_size"})
    draft = draft.to(device=next(target.parameters()).device, dtype=torch.float32)
    return add_lora_to_draft(draft, r=args.lora_r, alpha=args.lora_alpha) if args.lora else draft


def _set_draft_vocabulary(model, size: int, rows) -> None:
    """With the recipe's `draft.draft_vocab_size` = n > 0: the draft proposes from the n tokens most frequent in its
    training rows (`vocabulary.py`), unless a continued draft already has a vocabulary of that size."""
    from transformers_longspec.trainers import unwrap_draft
    from transformers_longspec.vocabulary import frequent_tokens

    draft = unwrap_draft(model)
    if size and draft.config.draft_vocab_size != size:
        draft.set_draft_vocabulary(frequent_tokens(rows, size, draft.config.vocab_size))


def run_train(args) -> dict:
    """Run `longspec train`: load target and recipe, build data and draft, train, save the final draft.

    The final draft goes to `--output` in `--save-dtype` (loadable with
    `LongSpecDraft.from_pretrained(output, target_model=target)`); with `--lora` the adapter goes to
    `--output/adapter` and the MERGED draft to `--output`. A summary (`longspec_training.json`) records the
    recipe, target, steps, losses, seconds per phase (`timings_s`) and the Trainer's `log_history` (one dict per
    logging step: `step`, `loss`, `learning_rate`, `grad_norm`, ...; per evaluation: `step`, `eval_loss`); the
    draft's model card (README.md) quotes it.

    Args:
        args: the `argparse.Namespace` of the `train` subcommand.
    Returns: the summary dict.
    Raises: ValueError / FileNotFoundError / ImportError for user mistakes (bad recipe, paths, missing peft).
    Reference: LongSpec §4.1; transformers `Trainer.train`.
    """
    from transformers import IntervalStrategy

    from transformers_longspec.trainers import (
        LongSpecTrainer,
        TimeBudgetCallback,
        merge_lora_draft,
        save_trained_draft,
    )
    from transformers_longspec.trainers.recipes import build_datasets, build_training_arguments, load_recipe

    start = time.perf_counter()
    _check_train_args(args)
    recipe = _with_data_overrides(load_recipe(args.recipe), args.set_data, args.set_mix)
    overrides, device, bf16 = _training_overrides(args, recipe)
    training_args = build_training_arguments(recipe, args.output, **overrides)
    # Several processes (accelerate launch): load on the CPU; the trainer shards the target or moves it to the GPU.
    load_device = "cpu" if training_args.world_size > 1 else device
    target, tokenizer = load_target(args.target, torch.bfloat16 if bf16 else torch.float32, load_device)
    model = _build_model(args, recipe, target)
    timings = {"load_s": time.perf_counter() - start}
    train_rows, eval_rows, collator = build_datasets(recipe.data, tokenizer, target)
    timings["data_s"] = time.perf_counter() - start - timings["load_s"]
    _set_draft_vocabulary(model, recipe.draft.get("draft_vocab_size", 0), train_rows)
    print(f"longspec train: recipe {recipe.name}, {len(train_rows)} training rows, "
          f"{len(eval_rows or [])} eval rows, {recipe.data.seq_length} tokens per row "
          f"(load {timings['load_s']:.1f} s, data {timings['data_s']:.1f} s)")
    if not eval_rows and training_args.eval_strategy != IntervalStrategy.NO:
        print("longspec train: no evaluation rows (eval_sequences=0): evaluation during training is off")
        training_args.eval_strategy = IntervalStrategy.NO
    budget = [TimeBudgetCallback(args.max_minutes * 60)] if args.max_minutes is not None else []
    trainer = LongSpecTrainer(model=model, args=training_args, target_model=target, train_dataset=train_rows,
                              eval_dataset=eval_rows, data_collator=collator, callbacks=budget)
    if args.lora and (trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled):
        raise ValueError("--lora runs on one process or under DDP (accelerate launch without FSDP/DeepSpeed): "
                         "a one-layer draft's adapter needs no sharding")
    result = trainer.train(resume_from_checkpoint=True if args.resume else None)
    if eval_rows:
        print(f"longspec train: final evaluation on {len(eval_rows)} rows (--set-data eval_sequences=0 skips it)")
    metrics = trainer.evaluate() if eval_rows else {}
    output = Path(args.output)
    summary = {
        "recipe": recipe.name, "recipe_description": recipe.description, "target": args.target,
        "draft_init": args.draft or "from_target", "lora": args.lora,
        "steps": result.global_step, "max_steps": training_args.max_steps,
        "stopped_by_time_budget": bool(budget and budget[0].stopped_at_step is not None),
        "train_loss": result.training_loss, "eval_loss": metrics.get("eval_loss"),
        "train_runtime_s": result.metrics.get("train_runtime"), "total_runtime_s": time.perf_counter() - start,
        "device": device, "bf16": bf16, "save_dtype": args.save_dtype, "overrides": _parse_sets(args.set),
        "data_overrides": {**_parse_sets(args.set_data), **_parse_sets(args.set_mix)}, "timings_s": timings,
        "log_history": trainer.state.log_history,
    }
    if trainer.is_world_process_zero():
        output.mkdir(parents=True, exist_ok=True)  # the record first: save_pretrained puts it into the model card
        (output / "longspec_training.json").write_text(json.dumps(summary, indent=2) + "\n")
    save_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.save_dtype]
    if not args.lora:
        save_trained_draft(trainer, output, save_dtype)  # gathers sharded weights: every process takes part
    elif trainer.is_world_process_zero():
        model.save_pretrained(output / "adapter")
        merge_lora_draft(model).to(save_dtype).save_pretrained(output)
    print(f"longspec train: draft saved to {output} "
          f"(load with LongSpecDraft.from_pretrained({str(output)!r}, target_model=target))")
    return summary
