"""Training text available offline on any machine: installed third-party packages and the target's own output.

The project's evaluation material must never be trained on: the CPython standard library, State of the Union
addresses, CHAMP, the Debian Policy Manual and llama.cpp / ggml sources. `python_package_sources` therefore
refuses standard-library module names and llama.cpp-derived packages, and skips every file that `exclusions.py`
recognises as evaluation material. `corpus.py` reads more kinds (C/C++, other languages, docs, man pages).

Reference: LongSpec (arXiv 2502.17421) §4.1 (training data); DESIGN.md §5 (what we may train on).
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from .exclusions import EXCLUDED_PACKAGES, evaluation_reason, refuse_package

__all__ = ["EXCLUDED_PACKAGES", "python_package_sources", "self_distill_texts", "source_snippet_prompts"]

_PROMPT_TASKS = (
    "Explain what the following Python code does, step by step.",
    "Write a concise docstring for the main function or class in this code, then explain its edge cases.",
    "Review this code: point out one possible bug or improvement and show the corrected code.",
)


def _package_files(name: str, extensions: Sequence[str]) -> list[Path]:
    """Source files of installed package `name`, sorted. Raises ValueError for stdlib / excluded / missing names."""
    refuse_package(name)
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ValueError(f"package '{name}' is not installed here; pip install it or remove it from the list")
    if spec.submodule_search_locations:
        roots = [Path(p) for p in spec.submodule_search_locations]
        return sorted(f for root in roots for ext in extensions for f in root.rglob(f"*{ext}") if f.is_file())
    return [Path(spec.origin)] if spec.origin and spec.origin.endswith(tuple(extensions)) else []


def python_package_sources(
    packages: Sequence[str] = ("torch", "transformers"),
    min_chars: int = 1000,
    max_chars: int | None = None,
    extensions: Sequence[str] = (".py",),
    max_documents: int | None = None,
    shuffle_seed: int | None = 0,
) -> Iterator[str]:
    """Yield the source files of installed third-party packages as training documents.

    Args:
        packages: importable package names, e.g. `["torch", "transformers", "numpy", "scipy"]`.
        min_chars: skip files shorter than this (characters); use ~20000 for long-context (stage 2) documents.
        max_chars: cut longer files to this many characters (None = whole file).
        extensions: file suffixes to read, e.g. `(".py", ".md", ".rst")`.
        max_documents: stop after this many documents.
        shuffle_seed: shuffle the file order with this seed (None = sorted order; neighbours are similar files).
    Yields: str, one file's text each (UTF-8; undecodable files are skipped).
    Raises: ValueError for a standard-library or llama.cpp-derived name, or a package that is not installed.
    Reference: DESIGN.md §5 (installed packages are allowed training text; the stdlib is not).
    """
    files = [f for name in packages for f in _package_files(name, extensions)]
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(files)
    count = 0
    for path in files:
        if max_documents is not None and count >= max_documents:
            return
        if evaluation_reason(path) is not None:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) < min_chars:
            continue
        count += 1
        yield text if max_chars is None else text[:max_chars]


def source_snippet_prompts(documents: Sequence[str], count: int, max_chars: int = 3000, seed: int = 0) -> list[str]:
    """Build instruction prompts around code snippets (prompts for self-distillation).

    Args:
        documents: source texts, e.g. from `python_package_sources`.
        count: prompts to build (documents are reused if there are fewer).
        max_chars: characters of code per prompt (a random window of the document).
        seed: RNG seed for the choice of document, window and task.
    Returns: list of `count` prompt strings.
    Raises: ValueError if `documents` is empty.
    Reference: LongSpec §4.1 (task data for stage 3); self-distillation on the target's own answers.
    """
    if not documents:
        raise ValueError("source_snippet_prompts needs at least one document")
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        doc = documents[rng.randrange(len(documents))]
        start = rng.randrange(max(len(doc) - max_chars, 0) + 1)
        prompts.append(f"{rng.choice(_PROMPT_TASKS)}\n\n```python\n{doc[start : start + max_chars]}\n```")
    return prompts


@torch.no_grad()
def self_distill_texts(target, tokenizer, prompts: Sequence[str], max_new_tokens: int = 256, batch_size: int = 8,
                       do_sample: bool = False, temperature: float = 0.7, use_chat_template: bool | None = None
                       ) -> list[dict]:
    """Let the target answer `prompts`; its answers are what the draft must learn to predict.

    Args:
        target: the target `*ForCausalLM` (on any device).
        tokenizer: its tokenizer.
        prompts: user prompts.
        max_new_tokens: tokens generated per prompt.
        batch_size: prompts per `generate` call (left-padded).
        do_sample: sample (with `temperature`) instead of greedy decoding.
        temperature: sampling temperature when `do_sample`.
        use_chat_template: wrap prompts in the chat template; None = when the tokenizer has one.
    Returns: with a chat template, [{"messages": [user, assistant]}] (for `ChatCollator`); else
        [{"text": prompt + completion}] (for `TextCollator`).
    Raises: ValueError if `use_chat_template=True` and the tokenizer has none.
    Reference: LongSpec §4.1; transformers `GenerationMixin.generate`.
    """
    chat = getattr(tokenizer, "chat_template", None) is not None if use_chat_template is None else use_chat_template
    if chat and getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("use_chat_template=True but the tokenizer has no chat template")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(target.parameters()).device
    records = []
    for start in range(0, len(prompts), batch_size):
        batch = list(prompts[start : start + batch_size])
        texts = [
            tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            if chat else p
            for p in batch
        ]
        enc = tokenizer(texts, add_special_tokens=False, padding=True, padding_side="left", return_tensors="pt")
        sampling = {"do_sample": True, "temperature": temperature} if do_sample else {"do_sample": False}
        out = target.generate(
            **enc.to(device), max_new_tokens=max_new_tokens, pad_token_id=pad, **sampling
        )
        completions = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        for prompt, completion in zip(batch, completions, strict=True):
            if chat:
                records.append({"messages": [{"role": "user", "content": prompt},
                                             {"role": "assistant", "content": completion}]})
            else:
                records.append({"text": prompt + completion})
    return records
