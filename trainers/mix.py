"""A mixed training set for a draft: short rows of several kinds, long rows, chat self-distillation, user jsonl.

Rows of very different lengths train together by grouping them into STEP ITEMS of about the same number of tokens
(the dataset's items are whole micro-batches; `StepCollator` passes one through, so `per_device_train_batch_size`
must be 1):

    short   `short_rows_per_step` packed blocks of `short_seq_length` tokens (anchor-offset positions: shorter
            than the trainer's anchor_max_length), kinds mixed by `kinds` (token fractions)
    long    one row of `long_seq_length` tokens (8k-32k) per item: neighbouring files of one package joined
            (`repository_documents`), every position labelled, natural positions
    chat    chat self-distillation rows (`chat_distill.py`), grouped up to `short_rows_per_step *
            short_seq_length` tokens per item, loss on the answers (or everywhere, `chat_loss="all"`)
    jsonl   the user's own files through `datasets`: {"text": ...} rows are packed into short rows,
            {"messages": [...]} rows become chat rows (assistant turns labelled, `ChatCollator`)

With `distill_labels` (recommended) every supervised position is relabelled by the target's argmax in the trainer.

Reference: LongSpec (arXiv 2502.17421) §4.1 (three data stages, here mixed in one run); reference spec §4.5-4.6.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.nn.utils.rnn import pad_sequence

from .chat_distill import DEFAULT_CHAT_TASKS, chat_distill_rows, chat_prompts, generate_answers, render_prompts
from .corpus import DOC_KINDS, CorpusStats, corpus_documents, repository_documents
from .data import ChatCollator, _pad_token_id, pack_texts
from .exclusions import refuse_evaluation, text_evaluation_reason

__all__ = ["MixSpec", "StepCollator", "build_mix", "chat_prompt_ids", "chat_rows", "read_user_jsonl",
           "short_and_long_rows"]


@dataclass
class MixSpec:
    """The `data.mix` section of a recipe (all lengths in tokens of the target's tokenizer).

    Args:
        kinds: token fractions of the short rows per document kind ("python", "c_cpp", "other_code", "docs",
            "prose"); normalised; a kind with too few documents here gives its shortfall to the kinds of larger share
            (reported in the stats; rows still missing after the largest kind are named in a warning).
        short_rows: packed short rows in all.
        short_seq_length: tokens per short row (below the trainer's anchor_max_length: anchor-offset positions).
        short_rows_per_step: short rows per step item.
        long_rows: long rows in all (0 = none).
        long_seq_length: tokens per long row (8192-32768; cut to this, rows shorter than `long_min_length` dropped).
        long_min_length: shortest long row kept.
        long_kinds: token fractions of the long rows per kind (a shortfall is named in a warning).
        chat_prompts: chat self-distillation prompts (0 = none).
        chat_prompt_chars: (min, max) characters of document per prompt.
        chat_long_prompts: chat prompts over LONG documents (neighbouring files of one package joined,
            `repository_documents`; 0 = none): the target's answers after a document of `chat_long_prompt_chars`
            characters (24k-56k: ~7k-16k tokens), so the draft learns what the target writes with a long cache to
            read, as in a long-context chat (short prompts teach the answers' voice, not that). Generated after the
            short prompts, in batches of as many prompt tokens (chat_batch_size x the short and long maxima's ratio),
            within what remains of `chat_time_budget_s` (the short prompts start no batch that would end past (1 -
            `chat_long_budget_share`) of it, judged by the previous batch's time).
        chat_parts_prompts: prompts per round over LONG documents (as `chat_long_prompts`, other excerpts) that
            ask for a summary of each part in turn (task "summarize_parts": each file or text of the joined
            document), answered before the long prompts within the same share of the time budget (0 = none).
        chat_long_budget_share: share (0 to 1) of `chat_time_budget_s` kept for the long prompts when there are
            both kinds (0.5: in session 14's lease 1,536 short prompts took the whole 90 s and no long one ran).
        chat_long_prompt_chars: (min, max) characters of document per long prompt.
        chat_max_new_tokens: answer length at most.
        chat_batch_size: prompts per batch of answers (`batch_greedy`).
        chat_time_budget_s: start no batch of answers after this many seconds (None = no limit). A batch is
            judged by the previous batch's time, so the first batch of each group (short, per-part, long prompts)
            starts whenever any of the budget remains, and the generation can end up to that batch's time past
            the budget (session 31: one batch of 24 long prompts, 143 s, ended 96 s past a 240 s budget).
        chat_cache: jsonl file caching the answers (None = no cache).
        chat_rounds: rounds of chat prompts (>= 1), each `chat_prompts` + `chat_long_prompts` prompts over the
            documents after the previous rounds' (from the first again when a kind runs out), with a seed of its own;
            round 0 is what one round always built. With `chat_cache`, the rounds an earlier run answered come from
            the cache, so a run with one round more spends its generation time on new answers and trains on all.
        chat_loss: "answer" (prompt masked) or "all".
        chat_repeat: times each chat item is in the training items (>= 1): the target's own answers are few next to
            the corpus rows (256 answers fill ~5% of a run's items), so repeating them weights what the target
            writes after a chat prompt (summaries, explanations) in the draft's training.
        chat_kinds: document kinds the chat prompts are built from.
        jsonl: the user's own .jsonl files (rows {"text"} or {"messages"}); never evaluation sets.
        jsonl_short_rows: packed short rows at most from the jsonl texts (None = all).
        rows_cache: a file keeping the built short and long rows (token ids, with the scan's statistics): read when
            it exists and was built with the same settings and tokenizer, written after building otherwise. Lets
            `longspec data` scan the corpus before (or beside) the run that trains, and several runs
            share one scan. Chat rows are not in it (their answers have `chat_cache`).
        chat_prompts_cache: a file keeping the chat prompts rendered by the chat template (token ids per round,
            with their scan's statistics), read and written as `rows_cache` is, keyed by the settings the prompts
            depend on and the tokenizer. `longspec data --prompts` fills it with the tokenizer alone, on the CPU,
            so the run that answers or trains on them does not spend GPU time on the scan and the chat template
            (204 s of session 29's train phase on an H100, before its first step).
        roots: folders to scan (None = the installed packages); evaluation material is refused.
        prose_roots: folders of general text (.txt / .md: books, articles, essays) for the kind "prose", which
            `kinds`, `long_kinds` and `chat_kinds` may name only when this is set (`benchmarks/build_prose.py`
            makes one from the Brown corpus); evaluation material is refused.
        system_docs: also read /usr/share/doc and man pages for "docs".
        min_chars: shortest document read for short rows (characters).
        eval_items: items of each type (short, long, chat) held out for evaluation.
        seed: shuffling, prompts, packages.
    Raises: ValueError from `__post_init__` for unknown kinds, negative counts, or bad lengths.
    Reference: LongSpec §4.1.
    """

    kinds: dict = field(default_factory=lambda: {"python": 0.4, "c_cpp": 0.25, "other_code": 0.05, "docs": 0.3})
    short_rows: int = 4096
    short_seq_length: int = 1024
    short_rows_per_step: int = 16
    long_rows: int = 0
    long_seq_length: int = 16384
    long_min_length: int = 8192
    long_kinds: dict = field(default_factory=lambda: {"python": 0.4, "c_cpp": 0.4, "docs": 0.2})
    chat_prompts: int = 0
    chat_prompt_chars: list = field(default_factory=lambda: [3000, 9000])
    chat_long_prompts: int = 0
    chat_long_prompt_chars: list = field(default_factory=lambda: [24000, 56000])
    chat_parts_prompts: int = 0
    chat_long_budget_share: float = 0.5
    chat_max_new_tokens: int = 384
    chat_batch_size: int = 64
    chat_time_budget_s: float | None = None
    chat_cache: str | None = None
    chat_rounds: int = 1
    chat_loss: str = "answer"
    chat_repeat: int = 1
    chat_kinds: list = field(default_factory=lambda: ["python", "c_cpp", "docs"])
    jsonl: list = field(default_factory=list)
    jsonl_short_rows: int | None = None
    rows_cache: str | None = None
    chat_prompts_cache: str | None = None
    roots: list | None = None
    prose_roots: list = field(default_factory=list)
    system_docs: bool = True
    min_chars: int = 500
    eval_items: int = 1
    seed: int = 0

    def __post_init__(self):
        for name in ("kinds", "long_kinds"):
            bad = sorted(set(getattr(self, name)) - set(DOC_KINDS))
            if bad or any(v < 0 for v in getattr(self, name).values()):
                raise ValueError(f"data.mix.{name}: kinds must be among {DOC_KINDS} with fractions >= 0, got "
                                 f"{getattr(self, name)}")
        bad = sorted(set(self.chat_kinds) - set(DOC_KINDS))
        if bad:
            raise ValueError(f"data.mix.chat_kinds: unknown kinds {bad}; choose from {DOC_KINDS}")
        counts = {"short_rows": 0, "long_rows": 0, "chat_prompts": 0, "chat_long_prompts": 0, "chat_parts_prompts": 0,
                  "eval_items": 0, "chat_repeat": 1, "chat_rounds": 1}  # name: least value
        for name, least in counts.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"data.mix.{name} must be an int >= {least}, got {value!r}")
        if self.short_seq_length < 2 or self.short_rows_per_step < 1:
            raise ValueError("data.mix: short_seq_length must be >= 2 and short_rows_per_step >= 1")
        if self.long_rows and not 2 <= self.long_min_length <= self.long_seq_length:
            raise ValueError(f"data.mix: need 2 <= long_min_length <= long_seq_length, got {self.long_min_length}, "
                             f"{self.long_seq_length}")
        for name in ("chat_prompt_chars", "chat_long_prompt_chars"):
            low, high = getattr(self, name)
            if not 0 < low <= high:
                raise ValueError(f"data.mix.{name} must be [min, max] characters with 0 < min <= max, got "
                                 f"{getattr(self, name)}")
        share = self.chat_long_budget_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
            raise ValueError(f"data.mix.chat_long_budget_share is a share of chat_time_budget_s in [0, 1], got "
                             f"{self.chat_long_budget_share!r}")
        if self.chat_loss not in ("answer", "all"):
            raise ValueError(f"data.mix.chat_loss must be 'answer' or 'all', got {self.chat_loss!r}")
        for path in self.jsonl:
            refuse_evaluation(path, "data.mix.jsonl")
        for name in ("roots", "prose_roots"):
            folders = getattr(self, name)
            if (folders is not None or name == "prose_roots") and (
                    isinstance(folders, (str, bytes, os.PathLike)) or not isinstance(folders, (list, tuple))
                    or not all(isinstance(f, (str, os.PathLike)) for f in folders)):
                raise ValueError(f"data.mix.{name} is a list of folders, e.g. [\"/data/prose\"], got {folders!r}")
        for root in self.roots or []:
            refuse_evaluation(root, "data.mix.roots")
        for root in self.prose_roots:
            refuse_evaluation(root, "data.mix.prose_roots")
            if not os.path.isdir(root):
                raise ValueError(f"data.mix.prose_roots {os.fspath(root)!r} is not a folder: give folders of .txt / "
                                 ".md texts (benchmarks/build_prose.py makes one)")
        asked = [n for n in ("kinds", "long_kinds") if getattr(self, n).get("prose")]
        asked += ["chat_kinds"] if "prose" in self.chat_kinds else []
        if asked and not self.prose_roots:
            raise ValueError(f"data.mix.{' / '.join(asked)} name the kind 'prose', which reads only "
                             "data.mix.prose_roots: set it to folders of plain-text books, articles or essays "
                             "(benchmarks/build_prose.py makes one), or drop 'prose'")


@dataclass
class StepCollator:
    """Pass one pre-built step item through (the dataset's items are whole micro-batches).

    Call: a list of exactly one item {"input_ids", "attention_mask", "labels"}, each (rows, seq) int64.
    Returns: that item.
    Raises: ValueError for more than one item: set per_device_train_batch_size=1 and per_device_eval_batch_size=1
        (the item holds the step's rows).
    """

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        if len(features) != 1:
            raise ValueError(f"a mixed dataset's items are whole micro-batches, got {len(features)} per batch: set "
                             "per_device_train_batch_size=1 and per_device_eval_batch_size=1 in the recipe")
        return dict(features[0])


def _item(rows: Sequence[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad rows ({"input_ids", optional "labels"}) into one (rows, seq) item; -100 / mask 0 on padding."""
    ids = [torch.as_tensor(r["input_ids"], dtype=torch.long) for r in rows]
    labels = [torch.as_tensor(r.get("labels", r["input_ids"]), dtype=torch.long) for r in rows]
    return {
        "input_ids": pad_sequence(ids, batch_first=True, padding_value=pad_id),
        "attention_mask": pad_sequence([torch.ones_like(i) for i in ids], batch_first=True, padding_value=0),
        "labels": pad_sequence(labels, batch_first=True, padding_value=-100),
    }


def _by_budget(rows: list[dict], budget: int, pad_id: int) -> list[dict]:
    """Group variable-length rows (sorted by length) into items of at most `budget` padded tokens each."""
    rows = sorted(rows, key=lambda r: len(r["input_ids"]))
    items, group = [], []
    for row in rows:
        if group and (len(group) + 1) * len(row["input_ids"]) > budget:
            items.append(_item(group, pad_id))
            group = []
        group.append(row)
    if group:
        items.append(_item(group, pad_id))
    return items


def _shares(fractions: dict, total: int) -> dict[str, int]:
    """Split `total` rows over kinds by their fractions (largest remainders)."""
    weight = sum(fractions.values())
    if total == 0 or weight == 0:
        return {k: 0 for k in fractions}
    raw = {k: total * v / weight for k, v in fractions.items()}
    out = {k: int(v) for k, v in raw.items()}
    for k in sorted(raw, key=lambda k: out[k] - raw[k])[: total - sum(out.values())]:
        out[k] += 1
    return out


def _short_rows(spec: MixSpec, tokenizer, stats: CorpusStats) -> list[dict]:
    """Packed short rows per kind; a kind that runs short leaves its rows to the next kinds."""
    rows, missing = [], 0
    shares = _shares(spec.kinds, spec.short_rows)
    for kind in sorted(shares, key=lambda k: shares[k]):  # smallest first: their shortfall goes to larger kinds
        want = shares[kind] + missing if shares[kind] else 0
        if want == 0:
            continue
        docs = corpus_documents(kind, _roots(spec, kind), spec.min_chars, max_chars=200_000, seed=spec.seed,
                                system_docs=spec.system_docs, stats=stats)
        got = pack_texts(docs, tokenizer, spec.short_seq_length, want)
        stats.documents[f"short_rows_{kind}"] = len(got)
        missing = want - len(got)
        rows.extend(got)
    if missing:
        warnings.warn(f"data.mix: {len(rows)} of {spec.short_rows} short rows built; the kinds {sorted(shares)} ran "
                      "out of documents (short_rows_* in the stats): add folders (roots, prose_roots) or ask for "
                      "fewer short_rows", stacklevel=3)
    return rows


def _long_rows(spec: MixSpec, tokenizer, stats: CorpusStats) -> list[dict]:
    """Long rows (one long document each, cut to long_seq_length tokens, shorter than long_min_length dropped)."""
    rows = []
    for kind, want in _shares(spec.long_kinds, spec.long_rows).items():
        docs = repository_documents(kind, _roots(spec, kind), min_chars=int(spec.long_seq_length * 4.5),
                                    max_chars=int(spec.long_seq_length * 6), seed=spec.seed,
                                    system_docs=spec.system_docs, stats=stats)
        got = 0
        for doc in docs:
            if got >= want:
                break
            ids = tokenizer(doc, add_special_tokens=False)["input_ids"][: spec.long_seq_length]
            if len(ids) >= spec.long_min_length:
                rows.append({"input_ids": ids})
                got += 1
        stats.documents[f"long_rows_{kind}"] = got
        if got < want:
            warnings.warn(f"data.mix: {got} of {want} long rows of kind {kind!r} built (documents of at least "
                          f"{int(spec.long_seq_length * 4.5)} characters, {spec.long_min_length} tokens): add folders "
                          "or lower long_seq_length / long_min_length", stacklevel=3)
    return rows


_ROW_SETTINGS = ("kinds", "short_rows", "short_seq_length", "long_rows", "long_seq_length", "long_min_length",
                 "long_kinds", "roots", "prose_roots", "system_docs", "min_chars", "seed")


def _roots(spec: MixSpec, kind: str) -> list | None:
    """The folders a kind is read from: `prose_roots` for "prose", `roots` (None: the installed packages) else."""
    return spec.prose_roots if kind == "prose" else spec.roots


def _cache_key(spec: MixSpec, tokenizer, settings: Sequence[str]) -> dict:
    """What a cache of `spec` depends on: its `settings` and the tokenizer (a digest of its vocabulary, equal for a
    tokenizer read from a GGUF file and its `save_pretrained` copy). An empty `prose_roots` is left out, so caches
    written before it existed stay valid."""
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode()
    key = {k: getattr(spec, k) for k in settings if k != "prose_roots" or spec.prose_roots}
    return {**key, "tokenizer": hashlib.sha256(vocab).hexdigest()}


def _read_cache(path: str | None, key: dict, stats: CorpusStats, option: str) -> dict | None:
    """The saved payload of a cache file built with `key`, its scan's statistics added to `stats`; None when there is
    no such file. Raises ValueError (naming `option`) for a file built with other settings or another tokenizer."""
    if path is None or not Path(path).is_file():
        return None
    saved = torch.load(path, weights_only=True)
    if saved["key"] != json.loads(json.dumps(key)):
        changed = sorted(k for k in key if saved["key"].get(k) != json.loads(json.dumps(key[k])))
        raise ValueError(f"data.mix.{option} {path} was built with other {changed}; delete it or point {option} at "
                         "a new file")
    for name in ("documents", "skipped_evaluation"):
        getattr(stats, name).update(saved["stats"][name])
    stats.duplicates += saved["stats"]["duplicates"]
    stats.files_seen += saved["stats"]["files_seen"]
    return saved


def _write_cache(path: str | None, key: dict, stats: CorpusStats, **payload) -> None:
    """Save `payload` with `key` and the scan's statistics to `path` (None: nothing), for `_read_cache`."""
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        torch.save({"key": key, "stats": asdict(stats), **payload}, path)


def short_and_long_rows(spec: MixSpec, tokenizer, stats: CorpusStats) -> tuple[list[dict], list[dict]]:
    """The short and long rows of `spec`, from `spec.rows_cache` when it holds them, else built (and cached).

    Args:
        spec: the `MixSpec`. tokenizer: the target's tokenizer. stats: filled with the scan's counts (also from the
            cache).
    Returns: (short rows, long rows), each a list of {"input_ids": (tokens,) int64 tensor}.
    Raises: ValueError if the cache file was built with other settings or another tokenizer (it names them).
    """
    key = _cache_key(spec, tokenizer, _ROW_SETTINGS)
    saved = _read_cache(spec.rows_cache, key, stats, "rows_cache")
    if saved is not None:
        return ([{"input_ids": ids.long()} for ids in saved["short"]],
                [{"input_ids": ids.long()} for ids in saved["long"]])
    short = _short_rows(spec, tokenizer, stats)
    long_rows = _long_rows(spec, tokenizer, stats) if spec.long_rows else []
    _write_cache(spec.rows_cache, key, stats,
                 short=[torch.as_tensor(r["input_ids"], dtype=torch.int32) for r in short],
                 long=[torch.as_tensor(r["input_ids"], dtype=torch.int32) for r in long_rows])
    return short, long_rows


_CHAT_GROUPS = (  # (name, count setting, characters setting, tasks, seed offset), in the order they are answered
    ("chat", "chat_prompts", "chat_prompt_chars", DEFAULT_CHAT_TASKS, 0),
    ("chat_parts", "chat_parts_prompts", "chat_long_prompt_chars", ("summarize_parts",), 2),
    ("chat_long", "chat_long_prompts", "chat_long_prompt_chars", DEFAULT_CHAT_TASKS, 1))
_CHAT_CHARS = {name: chars for name, _, chars, _, _ in _CHAT_GROUPS}  # a group's prompt characters setting
_CHAT_PROMPT_SETTINGS = ("chat_prompts", "chat_prompt_chars", "chat_parts_prompts", "chat_long_prompts",
                         "chat_long_prompt_chars", "chat_rounds", "chat_kinds", "roots", "prose_roots", "system_docs",
                         "seed")


def chat_prompt_ids(spec: MixSpec, tokenizer, stats: CorpusStats) -> dict[str, list[list[list[int]]]]:
    """The chat self-distillation prompts of `spec`, rendered by the tokenizer's chat template: from
    `spec.chat_prompts_cache` when it holds them, else built from corpus documents (and cached there).

    Args:
        spec: the `MixSpec`. tokenizer: the target's tokenizer (with a chat template). stats: filled with the scan's
            counts (also from the cache).
    Returns: {group: one list of prompts (token ids) per round}, groups "chat" (short documents), "chat_parts"
        (long documents, a summary per part) and "chat_long" (long documents) as `spec` asks for them, in that order.
    Raises: ValueError if the cache was built with other settings or another tokenizer, no documents were found,
        or the tokenizer has no chat template.
    """
    key = _cache_key(spec, tokenizer, _CHAT_PROMPT_SETTINGS)
    saved = _read_cache(spec.chat_prompts_cache, key, stats, "chat_prompts_cache")
    if saved is not None:
        return {name: [[ids.tolist() for ids in round_] for round_ in rounds]
                for name, rounds in saved["prompts"].items()}
    groups = {}
    for name, count_setting, chars_setting, tasks, offset in _CHAT_GROUPS:
        count, chars = getattr(spec, count_setting), getattr(spec, chars_setting)
        if count:
            groups[name] = [render_prompts(tokenizer, chat_prompts(documents, count, tuple(chars), tasks,
                                                                   seed=spec.seed + offset + 1000 * round_))
                            for round_, documents in enumerate(_chat_documents(spec, count, chars, name != "chat",
                                                                               stats))]
    _write_cache(spec.chat_prompts_cache, key, stats,
                 prompts={name: [[torch.tensor(ids, dtype=torch.int32) for ids in round_] for round_ in rounds]
                          for name, rounds in groups.items()})
    return groups


def chat_rows(spec: MixSpec, tokenizer, target, stats: CorpusStats) -> list[dict]:
    """Chat self-distillation rows: prompts over corpus documents (`chat_prompt_ids`: short ones, then long ones;
    `spec.chat_rounds` rounds of each, earlier rounds first), the target's greedy answers (cached in
    `spec.chat_cache`; `spec.chat_time_budget_s` counts from the first answer). Returns a list of {"input_ids",
    "labels"} (lists of int64; labels -100 off the answers)."""
    start, counts = time.perf_counter(), stats.documents
    groups = chat_prompt_ids(spec, tokenizer, stats)
    counts["chat_prompts_s"] = round(time.perf_counter() - start, 1)
    start, rows = time.perf_counter(), []
    for name, rounds in groups.items():
        before, seconds = len(rows), []
        chars = getattr(spec, _CHAT_CHARS[name])
        batch = max(1, spec.chat_batch_size * spec.chat_prompt_chars[1] // chars[1])  # tokens per batch kept
        total = spec.chat_time_budget_s
        if total is not None and name == "chat" and (spec.chat_long_prompts or spec.chat_parts_prompts):
            total *= 1.0 - spec.chat_long_budget_share  # the long prompts' share is kept for them
        for prompt_ids in rounds:
            budget = None if total is None else max(total - (time.perf_counter() - start), 0.0)  # what remains
            answers = generate_answers(target, tokenizer, prompt_ids, spec.chat_max_new_tokens, batch, budget,
                                       spec.chat_cache, batch_seconds=seconds)
            rows += chat_distill_rows(prompt_ids, answers, spec.chat_loss)
        counts[f"{name}_rows"] = len(rows) - before
        counts[f"{name}_batches"] = len(seconds)  # where the generation time went
        counts[f"{name}_batch_s_max"] = round(max(seconds, default=0.0), 1)
    counts["chat_generate_s"] = round(time.perf_counter() - start, 1)
    return rows


def _chat_documents(spec: MixSpec, count: int, chars, long: bool, stats: CorpusStats) -> list[list[tuple[str, str]]]:
    """(kind, text) documents for `count` chat prompts of `chars` = (min, max) characters, the kinds of
    `spec.chat_kinds` in turn: corpus documents, or joined neighbouring files of one package (`long`); one list per
    round of `spec.chat_rounds`, from one scan: round r takes each kind's documents after those of rounds 0..r-1,
    from the first again when they run out."""
    per_kind, rounds = max(1, count // max(len(spec.chat_kinds), 1)), [[] for _ in range(spec.chat_rounds)]
    for kind in spec.chat_kinds:
        if long:
            docs = repository_documents(kind, _roots(spec, kind), min_chars=chars[0], max_chars=2 * chars[1],
                                        seed=spec.seed + 2, stats=stats)
        else:
            docs = corpus_documents(kind, _roots(spec, kind), min_chars=chars[0], max_chars=100_000,
                                    seed=spec.seed + 1, system_docs=spec.system_docs, stats=stats)
        found = list(itertools.islice(docs, spec.chat_rounds * per_kind))
        for round_, documents in enumerate(rounds):
            first = round_ * per_kind % max(len(found), 1)
            documents.extend((kind, d) for d in (found[first:] + found[:first])[:per_kind])
    for round_, documents in enumerate(rounds):
        random.Random(spec.seed + round_).shuffle(documents)
    if not rounds[0]:
        name = "chat_long_prompt_chars" if long else "chat_prompt_chars"
        raise ValueError(f"chat self-distillation found no documents of kinds {spec.chat_kinds} (min {chars[0]} "
                         f"characters); lower {name}")
    return rounds


def read_user_jsonl(path: str | Path) -> list[dict]:
    """Rows of the user's own jsonl file through `datasets` ({"text": str} or {"messages": [...]} per line).

    Args:
        path: a .jsonl file (never the project's evaluation sets).
    Returns: list of {"text"} / {"messages"} dicts; rows whose text carries evaluation-material markers are dropped.
    Raises: ValueError for evaluation material or rows with neither field; ImportError naming `pip install datasets`.
    Reference: `datasets.load_dataset("json", data_files=...)`.
    """
    refuse_evaluation(path, "jsonl file")
    try:
        import datasets
    except ImportError as err:
        raise ImportError("reading your own jsonl needs the datasets package: pip install datasets") from err
    table = datasets.load_dataset("json", data_files=str(path), split="train")
    if "text" not in table.column_names and "messages" not in table.column_names:
        raise ValueError(f"{path}: rows need a 'text' or a 'messages' field, got columns {table.column_names}")
    rows = []
    for row in table:
        if row.get("text"):
            if text_evaluation_reason(row["text"]) is None:
                rows.append({"text": row["text"]})
        elif row.get("messages"):
            rows.append({"messages": row["messages"]})
    return rows


def _jsonl_rows(spec: MixSpec, tokenizer) -> tuple[list[dict], list[dict]]:
    """(packed short rows from the jsonl texts, chat rows from its conversations)."""
    texts, chats = [], []
    for path in spec.jsonl:
        for row in read_user_jsonl(path):
            (texts if "text" in row else chats).append(row)
    short = pack_texts((r["text"] for r in texts), tokenizer, spec.short_seq_length, spec.jsonl_short_rows)
    encoder = ChatCollator(tokenizer, max_length=1 << 30)
    chat = []
    for row in chats:
        ids, labels = encoder._encode(row["messages"])
        chat.append({"input_ids": ids, "labels": labels})
    return short, chat


def build_mix(spec: MixSpec, tokenizer, target=None) -> tuple[list[dict], list[dict], dict]:
    """Build the step items of a mixed training set.

    Args:
        spec: the `MixSpec`.
        tokenizer: the target's tokenizer.
        target: the target model (needed when `spec.chat_prompts` > 0: it generates the answers).
    Returns: (train items, eval items, stats); items are {"input_ids", "attention_mask", "labels"}, each (rows, seq)
        int64, for `StepCollator`; stats counts documents and rows per kind, evaluation files skipped and seconds.
    Raises: ValueError if chat prompts are asked for without a target or nothing was built.
    Reference: LongSpec §4.1.
    """
    chat = spec.chat_prompts or spec.chat_long_prompts or spec.chat_parts_prompts
    if chat and target is None:
        raise ValueError("data.mix.chat_prompts / chat_long_prompts / chat_parts_prompts > 0 need the target model to "
                         "generate the answers")
    stats, pad_id, start = CorpusStats.empty(), _pad_token_id(tokenizer), time.perf_counter()
    budget = spec.short_rows_per_step * spec.short_seq_length
    short, long_rows = short_and_long_rows(spec, tokenizer, stats)
    jsonl_short, jsonl_chat = _jsonl_rows(spec, tokenizer) if spec.jsonl else ([], [])
    short += jsonl_short
    random.Random(spec.seed).shuffle(short)
    groups = {
        "short": [_item(short[i : i + spec.short_rows_per_step], pad_id)
                  for i in range(0, len(short) - spec.short_rows_per_step + 1, spec.short_rows_per_step)],
        "long": [_item([row], pad_id) for row in long_rows],
        "chat": _by_budget((chat_rows(spec, tokenizer, target, stats) if chat else []) + jsonl_chat, budget, pad_id),
    }
    train, held = [], []
    for name, items in groups.items():
        keep = min(spec.eval_items, max(len(items) - 1, 0))
        held += items[len(items) - keep :] if keep else []
        train += items[: len(items) - keep] * (spec.chat_repeat if name == "chat" else 1)
        stats.documents[f"items_{name}"] = len(items)
    if not train:
        raise ValueError("the mixed data gave no training items; add kinds / documents, lower min_chars or "
                         "short_rows_per_step")
    random.Random(spec.seed).shuffle(train)
    summary = {"counts": stats.documents, "skipped_evaluation": stats.skipped_evaluation,
               "duplicates": stats.duplicates, "files_seen": stats.files_seen,
               "build_s": round(time.perf_counter() - start, 1), "spec": asdict(spec)}
    return train, held, summary
