"""Lossless check + τ on real documents: plain greedy vs LongSpec, side by side in one process.

For every prompt: plain `generate` once, then LongSpec `generate` with each draft (same dtype, same kernels for the
prefill), the token ids compared. At the first divergence the target's top-2 logit gap at that step is reported
(re-computed with plain decoding on the common prefix) and classified: a gap of at most `--near-tie-ulps` units in
the last place of the top logit (in the run's dtype) is a numerical near-tie, expected to flip in bf16; a larger
gap would be a bug (`near_tie: false`). τ, acceptance histogram and decode tok/s (prefill excluded: a 1-token
generate is timed and subtracted) per dataset, length bucket and draft. A short warm-up (kernel compilation,
allocator) runs first and is not timed.

    python benchmarks/eval_lossless.py --target smollm2 --draft path/to/draft --dtype bfloat16 \
        --datasets summarization,code_completion --per-bucket 2 --max-new-tokens 128 --out results.json
    python benchmarks/eval_lossless.py --target ~/qwen15 --draft ~/ablate-full,~/ablate-noanchor --buckets 16384 ...

Output JSON: {"meta": {...}, "rows": [Row, ...]}, one row per (prompt, draft); `draft` is the folder's name.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from transformers_longspec.bench import (
    default_eval_dir,
    first_divergence,
    select_eval_rows,
    timed_call,
    top2_logits,
)
from transformers_longspec.cli.models import load_draft, load_target
from transformers_longspec.demo import eval_prompt
from transformers_longspec.retrieval import DEFAULT_RETRIEVAL_TOKENS

EVAL_DIR = default_eval_dir()


@dataclass
class Row:
    id: str
    dataset: str
    bucket: int
    prompt_tokens: int
    new_tokens: int
    identical: bool
    draft: str = ""
    first_divergence: int | None = None
    top2_gap: float | None = None
    top1_logit: float | None = None
    near_tie: bool | None = None
    tau: float = 0.0
    histogram: dict = field(default_factory=dict)
    plain_tok_s: float = 0.0
    longspec_tok_s: float = 0.0


def ulp(value: float, dtype: torch.dtype) -> float:
    """Unit in the last place of `value` in `dtype` (bf16: 0.125 for 16 <= |value| < 32; fp32: 2**-19 there)."""
    info = torch.finfo(dtype)
    return info.eps * 2.0 ** math.floor(math.log2(max(abs(value), info.tiny)))


def _compare(target, plain: torch.Tensor, spec: torch.Tensor, prompt_len: int, near_tie_ulps: float) -> dict:
    """Identity of the two outputs and, if they differ, where and how close the target's top-2 logits were."""
    index = first_divergence(plain, spec, prompt_len)
    if index is None:
        return {"identical": True}
    top1, top2 = top2_logits(target, plain, prompt_len + index)
    gap = top1 - top2
    dtype = next(target.parameters()).dtype
    return {"identical": False, "first_divergence": index, "top2_gap": gap, "top1_logit": top1,
            "near_tie": gap <= near_tie_ulps * ulp(top1, dtype)}


def evaluate_prompt(target, drafts: dict, ids, max_new_tokens: int, widths, near_tie_ulps: float = 4.0) -> list[dict]:
    """Plain greedy once, then LongSpec greedy with each draft; one result dict per draft (same order)."""
    extra = {} if widths is None else {"longspec_beam_widths": widths}
    _, prefill = timed_call(lambda: target.generate(ids, do_sample=False, max_new_tokens=1))
    plain, t_plain = timed_call(lambda: target.generate(ids, do_sample=False, max_new_tokens=max_new_tokens))
    n = plain.shape[1] - ids.shape[1]
    plain_tok_s = (n - 1) / (t_plain - prefill) if t_plain > prefill else float("nan")  # noise on tiny CPU runs
    results = []
    for name, draft in drafts.items():
        spec = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=max_new_tokens, **extra)
        stats = draft.last_generation_stats
        results.append({
            "draft": name, "new_tokens": n, "tau": stats.tau, "histogram": stats.acceptance_histogram(),
            "plain_tok_s": plain_tok_s, "longspec_tok_s": stats.decode_tokens_per_s,
            **_compare(target, plain, spec, ids.shape[1], near_tie_ulps),
        })
    return results


def _warm_up(target, drafts: dict, ids: torch.Tensor, widths) -> None:
    """Untimed short generations (kernel compilation, allocator growth) before the measured ones."""
    extra = {} if widths is None else {"longspec_beam_widths": widths}
    short = ids[:, -256:]
    target.generate(short, do_sample=False, max_new_tokens=8)
    for draft in drafts.values():
        target.generate(short, assistant_model=draft, do_sample=False, max_new_tokens=8, **extra)


def _commit() -> str:
    """`LONGSPEC_COMMIT`, else `git rev-parse --short HEAD`, else "" (the GPU machine gets a copy without .git)."""
    if os.environ.get("LONGSPEC_COMMIT"):
        return os.environ["LONGSPEC_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def _parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="smollm2")
    p.add_argument("--draft", help="draft folder, or several separated by commas (each evaluated on every prompt)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--datasets", default="summarization,code_completion")
    p.add_argument("--buckets", default="2048,4096,8192,16384,30000")
    p.add_argument("--per-bucket", type=int, default=2)
    p.add_argument("--max-context", type=int, default=None, help="truncate contexts to this many tokens")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--tree", default=None, help="beam widths per depth, e.g. 4,16,16,16,16 (default: the draft's)")
    p.add_argument("--near-tie-ulps", type=float, default=4.0,
                   help="a divergence whose top-2 gap is at most this many ulps of the top logit is a near-tie")
    p.add_argument("--out", required=True)
    return p.parse_args()


def main() -> None:
    args = _parse_args()
    start = time.perf_counter()
    target, tokenizer = load_target(args.target, getattr(torch, args.dtype), args.device)
    paths = args.draft.split(",") if args.draft else [None]
    drafts = {Path(p).name if p else "default": load_draft(p, target) for p in paths}
    widths = [int(x) for x in args.tree.split(",")] if args.tree else None
    buckets = {int(b) for b in args.buckets.split(",")}
    print(f"eval_lossless: target + {len(drafts)} draft(s) loaded in {time.perf_counter() - start:.1f} s", flush=True)
    rows, warmed = [], False
    for name in args.datasets.split(","):
        for row in select_eval_rows(EVAL_DIR / f"{name}.jsonl", buckets, args.per_bucket):
            ids = eval_prompt(row, tokenizer, args.max_context).to(args.device)
            if not warmed:
                _warm_up(target, drafts, ids, widths)
                warmed = True
            tick = time.perf_counter()
            for r in evaluate_prompt(target, drafts, ids, args.max_new_tokens, widths, args.near_tie_ulps):
                rows.append(Row(id=row["_id"], dataset=name, bucket=row.get("bucket", 0),
                                prompt_tokens=ids.shape[1], **r))
                print(json.dumps(asdict(rows[-1])), flush=True)
            print(f"eval_lossless: {row['_id']} ({ids.shape[1]} tokens) in {time.perf_counter() - tick:.1f} s",
                  flush=True)
    meta = {"commit": _commit(), "dtype": args.dtype, "device": torch.cuda.get_device_name() if args.device == "cuda"
            else platform.processor() or "cpu", "torch": torch.__version__, "max_new_tokens": args.max_new_tokens,
            "tree": widths, "retrieval": DEFAULT_RETRIEVAL_TOKENS, "draft": args.draft,
            "near_tie_ulps": args.near_tie_ulps, "total_s": time.perf_counter() - start}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1))
    print(f"eval_lossless: {len(rows)} rows in {meta['total_s']:.1f} s -> {args.out}", flush=True)


if __name__ == "__main__":
    main()
