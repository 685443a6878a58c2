"""τ of several LongSpec configurations (tree shapes, retrieval on/off, retrieval alone) on the same prompts.

For every prompt (datasets × length buckets × per-bucket rows) each configuration runs one greedy `generate` with
the same draft; recorded per run: τ, the acceptance histogram, tokens accepted from the retrieval branch, decode
tok/s of that call (prefill excluded via `LongSpecStats`), and whether the output equals the first configuration's
(every configuration is lossless, so a difference can only be a bf16 near-tie). The chain configuration
(`[1] * 6`, no retrieval) gives the draft's first-token acceptance rate: the share of steps emitting >= 2 tokens.
Configurations run one after the other over all prompts (longest first), without compiled regions (τ does not
depend on them), so each builds its static engine once; the decode tok/s recorded include graph captures.

    python benchmarks/tau_matrix.py --target ~/qwen15 --draft ~/draft \
        --datasets code_completion,summarization,heldout --buckets 8192,16384,30000 --per-bucket 2 \
        --max-new-tokens 256 --out tau_matrix.json

Output: JSON {"meta", "rows"} (rewritten after every run, so a run stopped at a time limit keeps its rows) and a
markdown table (median τ per dataset × bucket × configuration) beside it.

A configuration is a name of `CONFIGS` or a tree shape `tree:W1-W2-...` with an optional node count `@K` (verify the
K best drafted nodes of the grown shape, `longspec_tree_nodes`) and retrieval length `+N`
(`tree:8-16-16-16-16+10`: a wider first level with 10-token retrieval; `tree:16-16-16-16-16-16-16-16@68+10`: the 68
best of eight levels, as many tokens verified as the default tree).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import time
from pathlib import Path

import torch

from transformers_longspec.bench import default_eval_dir, select_eval_rows
from transformers_longspec.cli.models import load_draft, load_target
from transformers_longspec.demo import eval_prompt

DEFAULT_TREE = [4, 16, 16, 16, 16]  # named, so that the default-tree policy does not pick another shape per device
CONFIGS = {
    "tree+retrieval": {"longspec_beam_widths": DEFAULT_TREE, "longspec_retrieval": 10},
    "tree": {"longspec_beam_widths": DEFAULT_TREE, "longspec_retrieval": 0},
    "chain": {"longspec_beam_widths": [1] * 6, "longspec_retrieval": 0},
    "retrieval_only": {"longspec_beam_widths": [], "longspec_retrieval": 10},
    "tree+retrieval24": {"longspec_beam_widths": DEFAULT_TREE, "longspec_retrieval": 24},
    "retrieval_only24": {"longspec_beam_widths": [], "longspec_retrieval": 24},
}


def config_kwargs(name: str) -> dict:
    """The `generate` arguments of a configuration: a `CONFIGS` name or `tree:W1-W2-...[@K][+N]` (widths per depth,
    K drafted nodes verified, default all; N retrieval tokens, default 0). Raises: ValueError naming both forms for
    anything else."""
    if name in CONFIGS:
        return CONFIGS[name]
    match = re.fullmatch(r"tree:(\d+(?:-\d+)*)(?:@(\d+))?(?:\+(\d+))?", name)
    if match is None and name.isdigit():
        raise ValueError(f"configuration {name!r} is a bare number: commas separate configurations, so a tree shape "
                         "takes '-' between its widths, e.g. tree:8-16-16-16-16+10")
    if match is None:
        raise ValueError(f"unknown configuration {name!r}: use one of {list(CONFIGS)} or a tree shape "
                         "tree:W1-W2-...[@K][+N], e.g. tree:8-16-16-16-16+10")
    kwargs = {"longspec_beam_widths": [int(w) for w in match[1].split("-")], "longspec_retrieval": int(match[3] or 0)}
    return kwargs if match[2] is None else {**kwargs, "longspec_tree_nodes": int(match[2])}


def run_config(target, draft, ids, kwargs: dict, new_tokens: int) -> tuple[torch.Tensor, dict]:
    out = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=new_tokens, **kwargs)
    s = draft.last_generation_stats
    steps = len(s.accepted_lengths)
    return out, {
        "tau": s.tau, "steps": steps, "new_tokens": s.new_tokens, "histogram": s.acceptance_histogram(),
        "first_token_accepted": sum(n >= 2 for n in s.accepted_lengths) / max(steps, 1),
        "retrieval_accepted": s.retrieval_accepted, "decode_tok_s": s.decode_tokens_per_s,
        "step_ms": 1e3 * (s.total_s - s.prefill_s) / max(steps, 1),
    }


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "–"


def markdown(rows: list[dict], configs: list[str]) -> str:
    lines = ["| dataset | bucket | prompts | " + " | ".join(f"τ {c}" for c in configs)
             + " | first-token acceptance (chain) |", "|---|---|---|" + "---|" * (len(configs) + 1)]
    keys = sorted({(r["dataset"], r["bucket"]) for r in rows})
    for dataset, bucket in keys:
        group = [r for r in rows if (r["dataset"], r["bucket"]) == (dataset, bucket)]
        cells = [_median([r[c]["tau"] for r in group if c in r]) for c in configs]
        cells.append(_median([r["chain"]["first_token_accepted"] for r in group if "chain" in r]))
        prompts = len({r["id"] for r in group})
        lines.append(f"| {dataset} | {bucket} | {prompts} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def add_prompt_arguments(p: argparse.ArgumentParser) -> None:
    """The options choosing the prompts and the target's dtype (shared with `accept_matrix.py`)."""
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--datasets", default="code_completion,summarization",
                   help="jsonl names in the eval folder, each optionally NAME:ROWS_PER_BUCKET (e.g. heldout:4)")
    p.add_argument("--buckets", default="8192,16384,30000", help="length buckets (prompt tokens), comma-separated")
    p.add_argument("--per-bucket", type=int, default=2, help="prompts per dataset and bucket")
    p.add_argument("--max-new-tokens", type=int, default=256, help="tokens generated per prompt")
    p.add_argument("--data-dir", default=None, help="folder of the evaluation jsonl files (default "
                   "$LONGSPEC_EVAL_DIR, else shared/data/eval in the folder that holds this checkout)")


def prompt_rows(args) -> list[tuple[str, dict]]:
    """(dataset name, row) for `add_prompt_arguments`' options. Raises: ValueError naming the option for a bad
    `--buckets`, `--datasets` or `--per-bucket`; FileNotFoundError for a missing jsonl file."""
    eval_dir = Path(args.data_dir) if args.data_dir else default_eval_dir()
    try:
        buckets = [int(b) for b in args.buckets.split(",")]
    except ValueError:
        raise ValueError(f"--buckets takes comma-separated token counts, e.g. 8192,16384; got {args.buckets!r}") \
            from None
    rows = []
    for spec in args.datasets.split(","):
        dataset, _, per_bucket = spec.partition(":")
        per_bucket = per_bucket or str(args.per_bucket)
        if not per_bucket.isdigit() or int(per_bucket) < 1:
            raise ValueError(f"prompts per bucket must be a positive number (--per-bucket, or NAME:N in --datasets); "
                             f"got {spec!r} with --per-bucket {args.per_bucket}")
        rows += [(dataset, row) for row in select_eval_rows(eval_dir / f"{dataset}.jsonl", buckets, int(per_bucket))]
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", default=None)
    add_prompt_arguments(p)
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help=f"names of {list(CONFIGS)} or tree shapes tree:W1-W2-...[@K][+N] (K drafted nodes "
                        "verified, N retrieval tokens)")
    p.add_argument("--max-seconds", type=float, default=1e9,
                   help="start no new prompt after this many seconds (shared equally by the configurations)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    configs = args.configs.split(",")
    try:  # bad configurations and missing data fail before the models load
        kwargs_of = {name: config_kwargs(name) for name in configs}
        rows = prompt_rows(args)
    except (ValueError, FileNotFoundError) as err:
        p.error(str(err))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    target, tokenizer = load_target(args.target, getattr(torch, args.dtype))
    target = target.to(device)
    draft = load_draft(args.draft, target)
    prompts = []
    for dataset, row in rows:
        ids = eval_prompt(row, tokenizer).to(device)
        record = {"id": row["_id"], "dataset": row.get("dataset") or dataset, "bucket": row.get("bucket", 0),
                  "prompt_tokens": ids.shape[1]}
        prompts.append((record, ids))
    prompts.sort(key=lambda p: -p[1].shape[1])  # the longest first: one engine per configuration serves them all
    meta = {"commit": os.environ.get("LONGSPEC_COMMIT", "unknown"), "device": torch.cuda.get_device_name()
            if device == "cuda" else platform.processor(), "target": args.target, "draft": args.draft,
            "dtype": args.dtype, "max_new_tokens": args.max_new_tokens, "configs": kwargs_of}
    outputs = {}
    for name in configs:  # configuration outermost: its static engine is built once
        kwargs = {**kwargs_of[name], "longspec_compile": False}  # τ does not depend on compiled regions
        start = time.perf_counter()
        for record, ids in prompts:
            if time.perf_counter() - start > args.max_seconds / len(configs):
                break  # this configuration's share of the time is spent: the shortest prompts are left out
            out, record[name] = run_config(target, draft, ids, kwargs, args.max_new_tokens)
            first = outputs.setdefault(record["id"], out)
            record[name]["same_as_first"] = bool(torch.equal(out, first))
            print(json.dumps({"config": name, **{k: v for k, v in record.items() if not isinstance(v, dict)},
                              "tau": round(record[name]["tau"], 3)}), flush=True)
            # rewritten after every run: a run stopped at its time limit keeps what it measured
            Path(args.out).write_text(json.dumps({"meta": meta, "rows": [r for r, _ in prompts]}, indent=1))
    rows = [record for record, _ in prompts]
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    table = markdown(rows, configs)
    Path(args.out).with_suffix(".md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
