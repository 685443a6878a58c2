"""Lossless check + τ on real documents: plain greedy vs LongSpec, side by side in one process.

For every prompt: plain `generate` and LongSpec `generate` (same dtype, same kernels for the prefill), the
token ids compared; at the first divergence the target's top-2 logit gap at that step is reported (a numerical
near-tie in bf16 is expected to flip, a large gap would be a bug). τ, acceptance histogram and decode tok/s
(prefill excluded: a 1-token generate is timed and subtracted) per dataset and length bucket.

    python benchmarks/eval_lossless.py --target smollm2 --draft path/to/draft --dtype bfloat16 \
        --datasets summarization,code_completion --per-bucket 2 --max-new-tokens 128 --out results.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from transformers_longspec.bench import (
    default_eval_dir,
    first_divergence,
    select_eval_rows,
    timed_call,
    top2_logit_gap,
)
from transformers_longspec.cli import load_draft, load_target
from transformers_longspec.demo import eval_prompt


@dataclass
class Row:
    id: str
    dataset: str
    bucket: int
    prompt_tokens: int
    new_tokens: int
    identical: bool
    first_divergence: int | None = None
    top2_gap: float | None = None
    tau: float = 0.0
    histogram: dict = field(default_factory=dict)
    plain_tok_s: float = 0.0
    longspec_tok_s: float = 0.0


def evaluate_prompt(target, draft, ids, max_new_tokens: int, widths) -> dict:
    extra = {} if widths is None else {"longspec_beam_widths": widths}
    _, prefill = timed_call(lambda: target.generate(ids, do_sample=False, max_new_tokens=1), ids.device)
    plain, t_plain = timed_call(lambda: target.generate(ids, do_sample=False, max_new_tokens=max_new_tokens),
                                ids.device)
    spec, _ = timed_call(lambda: target.generate(ids, assistant_model=draft, do_sample=False,
                                                 max_new_tokens=max_new_tokens, **extra), ids.device)
    stats = draft.last_generation_stats
    n = plain.shape[1] - ids.shape[1]
    result = {
        "new_tokens": n, "identical": bool(torch.equal(plain, spec)), "tau": stats.tau,
        "histogram": stats.acceptance_histogram(),
        "plain_tok_s": (n - 1) / max(t_plain - prefill, 1e-9), "longspec_tok_s": stats.decode_tokens_per_s,
    }
    divergence = first_divergence(plain, spec, ids.shape[1])
    if divergence is not None:
        result["first_divergence"] = divergence
        if ids.shape[1] + divergence < plain.shape[1]:
            result["top2_gap"] = top2_logit_gap(target, plain, ids.shape[1] + divergence)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="smollm2")
    p.add_argument("--draft")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--datasets", default="summarization,code_completion")
    p.add_argument("--buckets", default="2048,4096,8192,16384,30000")
    p.add_argument("--per-bucket", type=int, default=2)
    p.add_argument("--max-context", type=int, default=None, help="truncate contexts to this many tokens")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--tree", default=None)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    target, tokenizer = load_target(args.target, getattr(torch, args.dtype), args.device)
    draft = load_draft(args.draft, target)
    widths = [int(x) for x in args.tree.split(",")] if args.tree else None
    buckets = {int(b) for b in args.buckets.split(",")}
    rows = []
    for name in args.datasets.split(","):
        for row in select_eval_rows(default_eval_dir() / f"{name}.jsonl", buckets, args.per_bucket):
            bucket = row.get("bucket", 0)
            ids = eval_prompt(row, tokenizer, args.max_context).to(args.device)
            r = evaluate_prompt(target, draft, ids, args.max_new_tokens, widths)
            rows.append(Row(id=row["_id"], dataset=name, bucket=bucket, prompt_tokens=ids.shape[1], **r))
            print(json.dumps(asdict(rows[-1])), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = {"commit": commit, "dtype": args.dtype, "device": torch.cuda.get_device_name() if args.device == "cuda"
            else platform.processor(), "torch": torch.__version__, "max_new_tokens": args.max_new_tokens,
            "tree": widths, "draft": args.draft}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1))


if __name__ == "__main__":
    main()
