"""Benchmark prompts: rows of the LongBench-style evaluation sets, by length bucket, as the target's token ids.

Reference: shared/data/eval/README.md (row format); `transformers_longspec.demo.eval_prompt` (formatting).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..demo import eval_prompt

__all__ = ["Prompt", "default_eval_dir", "load_prompts", "select_eval_rows"]


@dataclass
class Prompt:
    """One benchmark prompt. ids: (1, prompt_len) int64 on the target's device; bucket: nominal length (tokens)."""

    id: str
    dataset: str
    bucket: int
    ids: torch.Tensor


def default_eval_dir() -> Path:
    """`$LONGSPEC_EVAL_DIR`, else `shared/data/eval` beside the repository checkout this file sits in."""
    if os.environ.get("LONGSPEC_EVAL_DIR"):
        return Path(os.environ["LONGSPEC_EVAL_DIR"])
    return Path(__file__).resolve().parents[4] / "shared" / "data" / "eval"


def select_eval_rows(path: str | Path, buckets, per_bucket: int) -> list[dict]:
    """The first `per_bucket` rows of each wanted length bucket of a LongBench-style jsonl file.

    Args:
        path: a `.jsonl` file of rows with `_id`, `context`, `input`, `dataset` and (optional) `bucket` (tokens).
        buckets: wanted buckets (tokens). Rows without a bucket (e.g. math problems: short prompts, long outputs)
            count as bucket 0 and are always eligible.
        per_bucket: rows kept per bucket.
    Returns: the selected rows, in file order.
    Raises: FileNotFoundError if `path` does not exist.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; pass --data-dir or set LONGSPEC_EVAL_DIR")
    wanted, seen, out = set(buckets), {}, []
    for line in path.open():
        row = json.loads(line)
        bucket = row.get("bucket", 0)
        if (bucket and bucket not in wanted) or seen.get(bucket, 0) >= per_bucket:
            continue
        seen[bucket] = seen.get(bucket, 0) + 1
        out.append(row)
    return out


def load_prompts(tokenizer, datasets, buckets, per_bucket: int, data_dir: str | Path | None = None,
                 max_context: int | None = None, device: str | torch.device = "cpu") -> list[Prompt]:
    """Benchmark prompts from the evaluation sets, shortest first (see `demo.eval_prompt` for the formatting).

    Args:
        tokenizer: the target's tokenizer (with a chat template for summaries and math).
        datasets: file stems under `data_dir`, e.g. ("code_completion", "summarization", "math_reasoning").
        buckets, per_bucket: see `select_eval_rows`. data_dir: default `default_eval_dir()`.
        max_context: truncate each context to this many tokens (None = whole); a prompt of a larger bucket then
            gets `max_context` as its bucket. device: where the ids go.
    Returns: list of `Prompt`, sorted by prompt length (tokens).
    Raises: FileNotFoundError for a missing file; ValueError for a row without context.
    """
    data_dir = Path(data_dir) if data_dir else default_eval_dir()
    prompts = []
    for name in datasets:
        for row in select_eval_rows(data_dir / f"{name}.jsonl", buckets, per_bucket):
            ids = eval_prompt(row, tokenizer, max_context).to(device)
            bucket = int(row.get("bucket", 0))
            if max_context is not None and bucket > max_context:  # a cut context is labelled by its real length
                bucket = max_context
            prompts.append(Prompt(id=row["_id"], dataset=name, bucket=bucket, ids=ids))
    return sorted(prompts, key=lambda p: p.ids.shape[1])
