"""Training recipes: a JSON file of `LongSpecTrainingArguments` + data settings per stage (see README.md here).

    {
      "description": "what this stage does",
      "draft": {"sliding_window": 512},               # LongSpecConfig overrides for a NEW draft (optional)
      "data": {"format": "packed", "source": "python_packages", "packages": ["torch"], "seq_length": 1024, ...},
      "training_arguments": {"learning_rate": 5e-4, "lr_scheduler_type": "cosine", "bf16": true, ...}
    }

`load_recipe("stage1")` reads a recipe shipped here, `load_recipe("my.json")` any file; `build_datasets` turns
its `data` section into (train, eval, collator); `build_training_arguments` its `training_arguments` section.

Reference: LongSpec (arXiv 2502.17421) §4.1 (three training stages).
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..arguments import LongSpecTrainingArguments
from ..data import (
    ChatCollator,
    TextCollator,
    TokenCollator,
    _pad_token_id,
    longbench_to_messages,
    pack_texts,
    read_longbench_jsonl,
)
from ..mix import MixSpec, StepCollator, build_mix
from ..sources import python_package_sources, self_distill_texts, source_snippet_prompts

__all__ = [
    "RECIPE_DIR",
    "DataSpec",
    "Recipe",
    "build_datasets",
    "build_training_arguments",
    "list_recipes",
    "load_recipe",
]

RECIPE_DIR = Path(__file__).parent
_FORMATS = ("packed", "text", "chat", "mix")
_SOURCES = ("python_packages", "jsonl", "self_distill", "mix")


@dataclass
class DataSpec:
    """The `data` section of a recipe.

    Args:
        format: "packed" (stage 1: fixed-length blocks), "text" (stage 2: one document per row) or
            "chat" (stage 3: chat template, assistant tokens labelled).
        source: "python_packages" (installed third-party package sources), "jsonl" (a file: rows with "text",
            "messages", or LongBench fields) or "self_distill" (the target answers prompts built from package
            sources).
        seq_length: tokens per row (block length for "packed", truncation length otherwise).
        packages: packages to read for "python_packages" / "self_distill"; missing ones are skipped with a warning.
        extensions: file suffixes read from the packages.
        min_chars: skip source files shorter than this (characters).
        max_documents: read at most this many documents (None = all).
        max_sequences: keep at most this many training rows (None = all).
        eval_sequences: rows held out for evaluation (taken from the end).
        path: the .jsonl file for source "jsonl" (never the project's evaluation sets).
        num_prompts, max_new_tokens, generation_batch_size: self-distillation size (prompts, tokens per answer,
            prompts per `generate` call).
        seed: shuffling / prompt seed.
        mix: for source / format "mix": the `MixSpec` fields (code of several languages, docs, long rows, chat
            self-distillation, your own jsonl; `trainers/mix.py`). Its items are whole micro-batches: the recipe
            needs per_device_train_batch_size = per_device_eval_batch_size = 1.

    Raises: ValueError from `__post_init__` for an unknown format/source, a chat format without a chat source, or a
        jsonl source without a path.
    Reference: LongSpec §4.1.
    """

    format: str = "packed"
    source: str = "python_packages"
    seq_length: int = 1024
    packages: list[str] = field(default_factory=lambda: ["torch", "transformers"])
    extensions: list[str] = field(default_factory=lambda: [".py"])
    min_chars: int = 1000
    max_documents: int | None = None
    max_sequences: int | None = None
    eval_sequences: int = 0
    path: str | None = None
    num_prompts: int = 256
    max_new_tokens: int = 256
    generation_batch_size: int = 32
    seed: int = 0
    mix: dict | None = None

    def __post_init__(self):
        if self.format not in _FORMATS:
            raise ValueError(f"data.format must be one of {_FORMATS}, got {self.format!r}")
        if self.source not in _SOURCES:
            raise ValueError(f"data.source must be one of {_SOURCES}, got {self.source!r}")
        if self.source == "jsonl" and not self.path:
            raise ValueError("data.source 'jsonl' needs data.path (a .jsonl of text, messages or LongBench rows)")
        if (self.source == "mix") != (self.format == "mix"):
            raise ValueError("data.source 'mix' and data.format 'mix' go together (the mix builds its own rows)")
        if self.source == "mix":
            unknown = sorted(set(self.mix or {}) - {f.name for f in fields(MixSpec)})
            if unknown:
                raise ValueError(f"data.mix: unknown settings {unknown}; allowed: {[f.name for f in fields(MixSpec)]}")
            MixSpec(**(self.mix or {}))  # validates (no I/O)
        if self.source == "self_distill" and self.format != "chat":
            raise ValueError("data.source 'self_distill' produces chats: use data.format 'chat'")
        if self.seq_length < 2 or self.eval_sequences < 0:
            raise ValueError(
                f"need seq_length >= 2 and eval_sequences >= 0, got {self.seq_length}, {self.eval_sequences}"
            )


@dataclass
class Recipe:
    """One training stage: `LongSpecTrainingArguments` fields, data settings and draft-config overrides.

    Args:
        description: what the stage does.
        training_arguments: `LongSpecTrainingArguments` fields (output_dir is supplied at run time).
        data: the `DataSpec`.
        draft: `LongSpecConfig` overrides used when a NEW draft is built (when continuing a draft, only
            `target_feature_layers` is read: a draft without them gets them added).
        name: the file it came from.
    Reference: LongSpec §4.1.
    """

    description: str
    training_arguments: dict
    data: DataSpec
    draft: dict = field(default_factory=dict)
    name: str = ""


def list_recipes() -> list[str]:
    """Names of the recipes shipped in this folder (usable as `load_recipe(name)` / `--recipe name`)."""
    return sorted(p.stem for p in RECIPE_DIR.glob("*.json"))


def load_recipe(name_or_path: str | Path) -> Recipe:
    """Read a recipe from a JSON file, or by name from the recipes shipped here.

    Args:
        name_or_path: a path to a .json file, or a shipped name such as "stage1" or "smollm2-gpu".
    Returns: the `Recipe`.
    Raises: FileNotFoundError listing the shipped recipes if nothing matches; ValueError naming unknown keys or
        `training_arguments` fields that `LongSpecTrainingArguments` does not have.
    Reference: LongSpec §4.1.
    """
    path = Path(name_or_path)
    if not path.is_file():
        name = path.name.removesuffix(".json")
        path = RECIPE_DIR / f"{name}.json"
    if not path.is_file():
        what = "file not found" if str(name_or_path).endswith(".json") else "not a shipped recipe"
        raise FileNotFoundError(f"no recipe {str(name_or_path)!r} ({what}): give an existing .json file or one of "
                                f"{list_recipes()}")
    raw = json.loads(path.read_text())
    unknown = sorted(set(raw) - {"description", "training_arguments", "data", "draft"})
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; allowed: description, training_arguments, data, draft")
    known = {f.name for f in fields(LongSpecTrainingArguments)}
    bad = sorted(set(raw.get("training_arguments", {})) - known)
    if bad:
        raise ValueError(f"{path}: {bad} are not LongSpecTrainingArguments fields")
    data_keys = {f.name for f in fields(DataSpec)}
    bad = sorted(set(raw.get("data", {})) - data_keys)
    if bad:
        raise ValueError(f"{path}: unknown data settings {bad}; allowed: {sorted(data_keys)}")
    return Recipe(
        description=raw.get("description", ""), training_arguments=dict(raw.get("training_arguments", {})),
        data=DataSpec(**raw.get("data", {})), draft=dict(raw.get("draft", {})), name=path.stem,
    )


def build_training_arguments(recipe: Recipe, output_dir: str, **overrides) -> LongSpecTrainingArguments:
    """`LongSpecTrainingArguments` from the recipe, with `overrides` (e.g. max_steps, use_cpu, bf16) on top.

    Raises: ValueError naming a setting that is not a training argument, or a float / int / bool argument given a
    value of another type (a `--set learning_rate=abc` would otherwise fail inside the optimiser, after the data
    build); ValueError from `LongSpecTrainingArguments` for inconsistent settings.
    Reference: transformers `TrainingArguments`.
    """
    settings = {**recipe.training_arguments, **overrides}
    _check_training_settings(settings)
    return LongSpecTrainingArguments(output_dir=output_dir, **settings)


_SCALARS = {"float": (int, float), "int": (int,), "bool": (bool,)}  # a field's declared type -> the values it takes


def _check_training_settings(settings: dict) -> None:
    """Each key a `LongSpecTrainingArguments` field; a field declared float / int / bool (or that | None) gets one."""
    declared = {f.name: str(getattr(f.type, "__name__", f.type)) for f in fields(LongSpecTrainingArguments) if f.init}
    unknown = sorted(set(settings) - set(declared))
    if unknown:
        raise ValueError(f"unknown training arguments {unknown}: use the names of LongSpecTrainingArguments / "
                         "transformers TrainingArguments (e.g. learning_rate, max_steps, noise_offsets_per_step)")
    for key, value in settings.items():
        kind = declared[key].replace(" | None", "").replace("None | ", "")
        ok = _SCALARS.get(kind)
        if ok is None or (value is None and kind != declared[key]):
            continue
        if isinstance(value, bool) and kind != "bool" or not isinstance(value, ok):
            raise ValueError(f"training argument {key} takes {'a' if kind != 'int' else 'an'} {kind}, got "
                             f"{value!r} ({type(value).__name__})")


def _installed(packages: list[str]) -> list[str]:
    found = [p for p in packages if importlib.util.find_spec(p.split(".")[0]) is not None]
    missing = sorted(set(packages) - set(found))
    if missing:
        warnings.warn(f"recipe data: packages {missing} are not installed here; training without them", stacklevel=3)
    if not found:
        raise ValueError(f"none of the recipe's packages {packages} is installed; install one or edit data.packages")
    return found


def _documents(spec: DataSpec) -> Iterator[str]:
    """The package sources, read lazily (packing stops reading once it has `max_sequences` blocks)."""
    return python_package_sources(
        _installed(spec.packages), min_chars=spec.min_chars, extensions=tuple(spec.extensions),
        max_documents=spec.max_documents, shuffle_seed=spec.seed,
    )


def _jsonl_rows(spec: DataSpec) -> list[dict]:
    """Rows of data.path as {"text"} / {"messages"} dicts; refuses the project's evaluation sets."""
    path = Path(spec.path).resolve()
    if path.parent.name == "eval" and path.parent.parent.name == "data":
        raise ValueError(f"{path} is evaluation material (data/eval); never train on it")
    rows = []
    with path.open(encoding="utf-8") as handle:
        first = json.loads(handle.readline() or "{}")
    if {"input", "context", "answers"} <= set(first):
        return [longbench_to_messages(r) for r in read_longbench_jsonl(path, spec.max_documents)]
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                rows.append(json.loads(line))
            if spec.max_documents is not None and len(rows) >= spec.max_documents:
                break
    return rows


def build_datasets(spec: DataSpec, tokenizer, target=None):
    """Turn a recipe's data section into datasets and the matching collator.

    Args:
        spec: the `DataSpec`.
        tokenizer: the target's tokenizer.
        target: the target model (needed for source "self_distill" only).
    Returns: (train rows, eval rows or None, collator); rows are lists of dicts (map-style datasets).
    Raises: ValueError if no training rows remain, or "self_distill" is asked for without a target.
    Reference: LongSpec §4.1.
    """
    if spec.source == "mix":
        train_rows, eval_rows, summary = build_mix(MixSpec(**(spec.mix or {})), tokenizer, target)
        print("longspec data: " + json.dumps({k: v for k, v in summary.items() if k != "spec"}))
        return train_rows, eval_rows or None, StepCollator()
    if spec.source == "self_distill":
        if target is None:
            raise ValueError("data.source 'self_distill' needs the target model to generate answers")
        prompts = source_snippet_prompts(list(_documents(spec)), spec.num_prompts, seed=spec.seed)
        rows = self_distill_texts(target, tokenizer, prompts, spec.max_new_tokens, spec.generation_batch_size)
    elif spec.source == "jsonl":
        rows = _jsonl_rows(spec)
    elif spec.format == "packed":
        rows = pack_texts(_documents(spec), tokenizer, spec.seq_length, _total(spec))
    else:
        rows = [{"text": doc} for doc in _documents(spec)]
    if spec.format == "packed" and spec.source != "python_packages":
        if any("text" not in r for r in rows):
            raise ValueError("data.format 'packed' needs rows with a 'text' field; use format 'chat' for messages")
        rows = pack_texts((r["text"] for r in rows), tokenizer, spec.seq_length, _total(spec))
    rows = rows[: _total(spec)] if _total(spec) is not None else rows
    eval_rows = rows[len(rows) - spec.eval_sequences :] if spec.eval_sequences else None
    train_rows = rows[: len(rows) - spec.eval_sequences]
    if not train_rows:
        raise ValueError(
            f"the recipe's data gave {len(rows)} rows, {spec.eval_sequences} held out for eval: none left to train. "
            "Add packages / documents, lower min_chars or eval_sequences"
        )
    collators = {
        "packed": TokenCollator(_pad_token_id(tokenizer), spec.seq_length),
        "text": TextCollator(tokenizer, spec.seq_length),
        "chat": ChatCollator(tokenizer, spec.seq_length),
    }
    return train_rows, eval_rows, collators[spec.format]


def _total(spec: DataSpec) -> int | None:
    return None if spec.max_sequences is None else spec.max_sequences + spec.eval_sequences
