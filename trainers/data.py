"""Datasets and collators for the three LongSpec training stages.

    stage 1  pack_texts(texts, tok, 1024)  + TokenCollator   fixed-length short blocks, every token labelled
    stage 2  TextCollator(tok, 16384)                          one long document per row, truncated, padded
    stage 3  ChatCollator(tok, 8192)                           the target's chat template, assistant tokens labelled

Every collator returns `input_ids` (batch, seq) int64, `attention_mask` (batch, seq) int64 (1 = token) and
`labels` (batch, seq) int64 with -100 on padding (and on prompts in stage 3). Padding is always on the right:
the draft and the target attend causally, so right padding never changes a real token's result. Datasets are
plain Python lists of dicts (a map-style dataset for the `Trainer`), so no extra dependency is needed.

Reference: LongSpec (arXiv 2502.17421) §3.2 and §4.1 (training stages and data); transformers data collators.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

__all__ = [
    "LONGBENCH_FIELDS",
    "ChatCollator",
    "TextCollator",
    "TokenCollator",
    "longbench_to_messages",
    "pack_texts",
    "read_longbench_jsonl",
]

LONGBENCH_FIELDS = ("_id", "dataset", "input", "context", "answers", "length", "bucket")


def _pad_token_id(tokenizer) -> int:
    """The tokenizer's pad id, else its EOS id (padding is masked by `attention_mask`, never by id)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("the tokenizer has neither a pad nor an EOS token; set tokenizer.pad_token first")
    return pad


def pack_texts(texts: Iterable[str], tokenizer, seq_length: int, max_sequences: int | None = None,
               add_eos: bool = True, batch_size: int = 256) -> list[dict]:
    """Tokenize documents, join them (EOS between) and cut the stream into blocks of `seq_length` tokens.

    Stage-1 data: every token of every block is labelled, no padding. The incomplete tail block is dropped.

    Args:
        texts: documents (any iterable of str; consumed lazily, `batch_size` at a time).
        tokenizer: the target's tokenizer (fast tokenizers batch in parallel).
        seq_length: tokens per block (>= 2).
        max_sequences: stop after this many blocks (None = use every document).
        add_eos: append the EOS token after each document.
        batch_size: documents tokenized per call.
    Returns: list of {"input_ids": (seq_length,) int64 tensor}.
    Raises: ValueError if `seq_length` < 2 or `add_eos` is set and the tokenizer has no EOS token.
    Reference: LongSpec §4.1 (stage 1: short-text pre-training, 1024-token sequences).
    """
    if seq_length < 2:
        raise ValueError(f"seq_length must be >= 2 tokens, got {seq_length}")
    if add_eos and tokenizer.eos_token_id is None:
        raise ValueError("add_eos=True needs a tokenizer with an EOS token; set tokenizer.eos_token or add_eos=False")
    blocks: list[dict] = []
    stream: list[int] = []
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == batch_size:
            stream = _cut_blocks(stream + _token_stream(tokenizer, batch, add_eos), seq_length, blocks, max_sequences)
            batch = []
        if max_sequences is not None and len(blocks) >= max_sequences:
            return blocks[:max_sequences]
    if batch:
        _cut_blocks(stream + _token_stream(tokenizer, batch, add_eos), seq_length, blocks, max_sequences)
    return blocks if max_sequences is None else blocks[:max_sequences]


def _token_stream(tokenizer, texts: list[str], add_eos: bool) -> list[int]:
    """Token ids of `texts` joined into one list (EOS after each document when `add_eos`).

    A fast tokenizer encodes through its Rust backend without offsets (`encode_batch_fast`): the same ids as
    `tokenizer(texts)`, 1.3-2.8x faster on CPU because no offsets, attention masks or Python dicts are built.
    """
    if getattr(tokenizer, "is_fast", False):
        encoded = [e.ids for e in tokenizer.backend_tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
    else:
        encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    stream: list[int] = []
    for ids in encoded:
        stream.extend(ids)
        if add_eos:
            stream.append(tokenizer.eos_token_id)
    return stream


def _cut_blocks(stream: list[int], seq_length: int, blocks: list[dict], max_sequences: int | None) -> list[int]:
    """Append full blocks of `stream` to `blocks`; return the leftover tail."""
    full = len(stream) // seq_length
    if max_sequences is not None:
        full = min(full, max(max_sequences - len(blocks), 0))
    if full:
        tensor = torch.tensor(stream[: full * seq_length], dtype=torch.long).view(full, seq_length)
        blocks.extend({"input_ids": row} for row in tensor)
    return stream[full * seq_length :]


@dataclass
class TokenCollator:
    """Right-pad pre-tokenized rows into a batch.

    Args:
        pad_token_id: id written into padding (masked out by `attention_mask` and `labels`).
        max_length: truncate longer rows to this many tokens (None = no limit).
        pad_to_multiple_of: round the padded length up to a multiple of this (tensor-core friendly shapes).

    Call: features, each {"input_ids": list[int] | (seq,) int64 tensor, optional "labels": same length}.
    Returns: {"input_ids", "attention_mask", "labels"}, each (batch, seq) int64; labels default to input_ids,
        -100 on padding.
    Raises: ValueError if a row is empty or its labels have another length.
    Reference: transformers `DataCollatorForLanguageModeling(mlm=False)` (same outputs, but padding is masked by
        position, so an EOS that doubles as the pad token keeps its label).
    """

    pad_token_id: int
    max_length: int | None = None
    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        ids, labels = [], []
        for row in features:
            row_ids = torch.as_tensor(row["input_ids"], dtype=torch.long)[: self.max_length]
            row_labels = torch.as_tensor(row.get("labels", row_ids), dtype=torch.long)[: self.max_length]
            if row_ids.numel() == 0 or row_labels.shape != row_ids.shape:
                raise ValueError(
                    f"each row needs non-empty input_ids and labels of the same length, got {row_ids.numel()} ids "
                    f"and {row_labels.numel()} labels"
                )
            ids.append(row_ids)
            labels.append(row_labels)
        batch_ids = pad_sequence(ids, batch_first=True, padding_value=self.pad_token_id)
        batch_labels = pad_sequence(labels, batch_first=True, padding_value=-100)
        mask = pad_sequence([torch.ones_like(r) for r in ids], batch_first=True, padding_value=0)
        if self.pad_to_multiple_of:
            extra = -batch_ids.shape[1] % self.pad_to_multiple_of
            batch_ids = F.pad(batch_ids, (0, extra), value=self.pad_token_id)
            batch_labels = F.pad(batch_labels, (0, extra), value=-100)
            mask = F.pad(mask, (0, extra), value=0)
        return {"input_ids": batch_ids, "attention_mask": mask, "labels": batch_labels}


@dataclass
class TextCollator:
    """Tokenize one document per row (stage 2, long context): truncate to `max_length`, right-pad, label all.

    Args:
        tokenizer: the target's tokenizer.
        max_length: tokens per row at most (the documents' tails are cut).
        add_eos: append EOS to documents that fit.
        pad_to_multiple_of: see `TokenCollator`.

    Call: features, each {"text": str}.
    Returns: see `TokenCollator`.
    Raises: ValueError if a row has no "text" (fix the dataset columns) or the tokenizer has no pad/EOS token.
    Reference: LongSpec §4.1 (stage 2: long-context training).
    """

    tokenizer: object
    max_length: int
    add_eos: bool = True
    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        if any("text" not in row for row in features):
            raise ValueError("TextCollator needs a 'text' column in every row; map your dataset to {'text': ...}")
        eos = self.tokenizer.eos_token_id if self.add_eos else None
        encoded = self.tokenizer([row["text"] for row in features], add_special_tokens=False)["input_ids"]
        rows = [{"input_ids": (ids + [eos] if eos is not None else ids)[: self.max_length]} for ids in encoded]
        return TokenCollator(_pad_token_id(self.tokenizer), self.max_length, self.pad_to_multiple_of)(rows)


@dataclass
class ChatCollator:
    """Render chats with the target's chat template (stage 3, SFT); label assistant turns only when possible.

    Assistant spans are found by rendering each prefix of the conversation: the text added by assistant turn i is
    `render(messages[:i+1])` minus `render(messages[:i], add_generation_prompt=True)`; tokens are labelled by their
    character offsets. If the template does not render prefixes as prefixes (e.g. it rewrites earlier turns) or the
    tokenizer is not a fast one, every token is labelled and a warning says so. Conversations longer than
    `max_length` keep their LAST `max_length` tokens (the answers).

    Args:
        tokenizer: the target's tokenizer, with a chat template.
        max_length: tokens per row at most.
        assistant_only: label only assistant tokens (False: label the whole conversation).
        pad_to_multiple_of: see `TokenCollator`.

    Call: features, each {"messages": [{"role": "user" | "assistant" | "system", "content": str}, ...]}.
    Returns: see `TokenCollator`.
    Raises: ValueError if a row has no "messages" or the tokenizer has no chat template.
    Reference: LongSpec §4.1 (stage 3: SFT, answer-only labels); transformers `apply_chat_template`.
    """

    tokenizer: object
    max_length: int
    assistant_only: bool = True
    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError("ChatCollator needs a tokenizer with a chat template (tokenizer.chat_template is None)")
        rows = []
        for row in features:
            if "messages" not in row:
                raise ValueError("ChatCollator needs a 'messages' column (a list of {'role', 'content'} dicts)")
            ids, labels = self._encode(row["messages"])
            rows.append({"input_ids": ids[-self.max_length :], "labels": labels[-self.max_length :]})
        return TokenCollator(_pad_token_id(self.tokenizer), None, self.pad_to_multiple_of)(rows)

    def _render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _encode(self, messages: list[dict]) -> tuple[list[int], list[int]]:
        """Token ids and labels of one conversation."""
        text = self._render(messages)
        spans = self._assistant_spans(messages, text) if self.assistant_only else None
        if spans is None:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            return ids, list(ids)
        encoding = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = encoding["input_ids"]
        labels = [
            tok if any(start <= begin < end for start, end in spans) else -100
            for tok, (begin, _) in zip(ids, encoding["offset_mapping"], strict=True)
        ]
        return ids, labels

    def _assistant_spans(self, messages: list[dict], text: str) -> list[tuple[int, int]] | None:
        """Character spans of the assistant turns in `text`, or None (with a warning) if they cannot be found."""
        if not getattr(self.tokenizer, "is_fast", False):
            warnings.warn("ChatCollator: slow tokenizer has no offsets; labelling every token", stacklevel=3)
            return None
        spans = []
        for i, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            before = self._render(messages[:i], add_generation_prompt=True) if i else ""
            through = self._render(messages[: i + 1])
            if not (text.startswith(through) and through.startswith(before)):
                warnings.warn(
                    "ChatCollator: the chat template does not render conversation prefixes as text prefixes; "
                    "labelling every token (pass assistant_only=False to silence this)",
                    stacklevel=3,
                )
                return None
            spans.append((len(before), len(through)))
        return spans


def read_longbench_jsonl(path: str | Path, limit: int | None = None) -> list[dict]:
    """Read a LongBench-style jsonl file (one JSON object per line, fields `LONGBENCH_FIELDS`).

    Only `input`, `context` and `answers` are required; `_id, dataset, length, bucket` are kept when present.
    Never train on the project's evaluation sets (`shared/data/eval/*.jsonl`).

    Args:
        path: the .jsonl file.
        limit: read at most this many rows.
    Returns: list of row dicts.
    Raises: ValueError naming the line of a row that is not an object or lacks a required field;
        FileNotFoundError if `path` does not exist.
    Reference: LongBench (Bai et al. 2023) data format.
    """
    rows = []
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            missing = [k for k in ("input", "context", "answers") if not isinstance(row, dict) or k not in row]
            if missing:
                raise ValueError(f"{path}:{number}: LongBench rows need fields {missing} (format: {LONGBENCH_FIELDS})")
            rows.append(row)
            if limit is not None and len(rows) >= limit:
                break
    return rows


def longbench_to_messages(row: dict, template: str = "{context}\n\n{input}") -> dict:
    """Turn a LongBench row into a one-turn chat for `ChatCollator` (the first answer is the assistant turn).

    Args:
        row: a row of `read_longbench_jsonl`.
        template: user prompt with `{context}` and `{input}` fields.
    Returns: {"messages": [user, assistant]}.
    Raises: ValueError if the row has no answer.
    Reference: LongBench data format; LongSpec §4.1 (long SFT stage).
    """
    answers = row["answers"] if isinstance(row["answers"], list) else [row["answers"]]
    if not answers:
        raise ValueError(f"LongBench row {row.get('_id', '?')} has no answers to train on")
    prompt = template.format(context=row["context"], input=row["input"])
    return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": str(answers[0])}]}
