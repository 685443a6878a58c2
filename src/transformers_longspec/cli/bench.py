"""`longspec bench`: every decoding method on the same real prompts and the same loaded target, in one process.

    longspec bench --target ~/stage/qwen2.5-coder-1.5b-instruct.gguf --draft drafts/qwen-1.5b \
        --assistant ~/stage/qwen2.5-coder-0.5b-instruct.gguf --methods sdpa,static_compile,longspec \
        --datasets code_completion,summarization --buckets 8192,16384,30000 --per-bucket 2 --out results/bench

Writes `rows.jsonl` (one row per method × prompt, as the run goes), `bench.json` (environment, arguments, rows,
aggregates), `decode_tok_s.png` and `tau.png` into `--out`, and prints a markdown table. The main CLI calls
`add_bench_parser(subparsers)` to register the command; user mistakes raise ValueError / FileNotFoundError /
ImportError before any model loads where possible (the CLI prints them in one line and exits with status 2).

Reference: `transformers_longspec.bench.harness` (what is measured and how).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from dataclasses import asdict
from pathlib import Path

import torch

from ..bench import (
    METHODS,
    BenchConfig,
    BenchModels,
    default_eval_dir,
    load_prompts,
    parse_variant,
    run_bench,
    select_eval_rows,
)
from ..bench.report import build_report, format_table, plot_report, write_report
from .models import check_draft_option, check_target_option, load_draft, load_target

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEFAULT_METHODS = "sdpa,eager,static_compile,plain_graph,assisted,prompt_lookup,longspec"


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `bench` subcommand to an `argparse` subparsers object (sets `func=run_bench_command`).

    Args:
        subparsers: the object returned by `ArgumentParser.add_subparsers()`.
    Returns: the `bench` sub-parser.
    Reference: Python `argparse`.
    """
    p = subparsers.add_parser(
        "bench", help="benchmark every decoding method side by side on real long prompts",
        description="Run vanilla generate (sdpa, eager, static cache + compile), a static-cache greedy loop replayed "
        "from a CUDA graph (plain_graph, the strongest plain baseline), HF assisted generation, prompt lookup and "
        "LongSpec (greedy and sampling) on the same prompts and the same loaded target; report decode tokens/s "
        "(prefill excluded), tau, exactness against sdpa, peak memory; write JSON + plots.")
    p.add_argument("--target", required=True, help="HF model folder, a .gguf file, or 'smollm2'")
    p.add_argument("--draft", help="saved LongSpec draft folder (default: bundled if it fits, else untrained)")
    p.add_argument("--assistant", help="small model (folder or .gguf) for HF assisted generation; without it "
                   "'assisted' is skipped")
    p.add_argument("--methods", default=DEFAULT_METHODS,
                   help=f"comma-separated, from {', '.join(METHODS)} and --variant names (default {DEFAULT_METHODS})")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=BASE:JSON",
                   help="extra method: BASE's generate kwargs updated with the JSON object, e.g. "
                   "'longspec_eager=longspec:{\"attn_implementation\": \"eager\"}' (repeatable; list NAME in "
                   "--methods)")
    p.add_argument("--temperatures", default="1.0", help="sampling temperatures for sample / longspec_sample")
    p.add_argument("--datasets", default="code_completion,summarization",
                   help="jsonl stems in the data folder: code_completion, summarization, math_reasoning, and heldout "
                   "(C/C++ completion and prose summaries absent from training: benchmarks/build_heldout.py writes "
                   ".evaldata/heldout.jsonl; pass --data-dir .evaldata or set LONGSPEC_EVAL_DIR)")
    p.add_argument("--buckets", default="8192,16384,30000",
                   help="context buckets (tokens) to take prompts from (default 8192,16384,30000; --per-bucket "
                   "prompts per dataset and bucket; on a CPU try --buckets 8192 --max-context 256 --max-new-tokens 8)")
    p.add_argument("--per-bucket", type=int, default=1, help="prompts per dataset and bucket (default 1)")
    p.add_argument("--max-context", type=int, default=None,
                   help="truncate contexts to this many tokens (default: the target's context - new tokens - 256)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="tokens generated per call (default 256)")
    p.add_argument("--data-dir", help="folder of the evaluation jsonl files (default $LONGSPEC_EVAL_DIR or "
                   "shared/data/eval beside the checkout)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="weights dtype (default: bf16 on CUDA, fp32 on a CPU, where bf16 is slow)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    p.add_argument("--seed", type=int, default=0, help="torch.manual_seed before every generate call")
    p.add_argument("--near-tie-gap", type=float, default=0.25,
                   help="a divergence with top-2 logit gap <= this is a near-tie (default 0.25)")
    p.add_argument("--eager-max-context", type=int, default=16384,
                   help="skip eager on prompts longer than this (its prefill materialises the score matrix)")
    p.add_argument("--max-seconds", type=float, default=None, help="start no new prompt after this many seconds")
    p.add_argument("--no-plots", dest="plots", action="store_false", help="skip the PNG plots")
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=run_bench_command)
    return p


def _split(text: str, kind, flag: str) -> tuple:
    try:
        values = tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated {kind.__name__} values, got {text!r}") from None
    if not values:
        raise ValueError(f"{flag} is empty")
    return values


def _config(args) -> BenchConfig:
    """Check every option that needs no model and build the `BenchConfig`."""
    variants = dict(parse_variant(spec) for spec in args.variant)
    methods = _split(args.methods, str, "--methods")
    unknown = [m for m in methods if m not in METHODS and m not in variants]
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; known: {', '.join([*METHODS, *variants])}")
    temperatures = _split(args.temperatures, float, "--temperatures")
    if any(t <= 0 for t in temperatures):
        raise ValueError(f"--temperatures must be > 0 (greedy methods cover T = 0), got {args.temperatures!r}")
    for flag, value in [("--per-bucket", args.per_bucket), ("--max-new-tokens", args.max_new_tokens)]:
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    return BenchConfig(methods=methods, temperatures=temperatures, max_new_tokens=args.max_new_tokens,
                       seed=args.seed, near_tie_gap=args.near_tie_gap, eager_max_context=args.eager_max_context,
                       max_seconds=args.max_seconds, variants=variants)


def _needs(config: BenchConfig, what: str) -> bool:
    known = {**METHODS, **config.variants}
    return any(known[m].requires == what for m in config.methods)


def _load_models(args, config: BenchConfig) -> tuple[BenchModels, object]:
    target, tokenizer = load_target(args.target, DTYPES[args.dtype], args.device)
    draft = load_draft(args.draft, target) if _needs(config, "draft") else None
    assistant = None
    if args.assistant and _needs(config, "assistant"):
        assistant = load_target(args.assistant, DTYPES[args.dtype], args.device)[0]
    return BenchModels(target=target, draft=draft, assistant=assistant), tokenizer


def run_bench_command(args) -> dict:
    """Run `longspec bench`: check options, load models and prompts, run, write JSON + plots, print the table.

    Args:
        args: the `argparse.Namespace` of the `bench` subcommand.
    Returns: the report dict (also written to `--out/bench.json`).
    Raises: ValueError / FileNotFoundError / ImportError for user mistakes (unknown method, bad list, missing data
        file, model path or matplotlib), before loading any model.
    """
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise ValueError(f"--device takes cpu, cuda or cuda:N, got {args.device!r}") from None
    if args.dtype is None:  # bf16 on a CPU is emulated (and GGUF targets load fastest in fp32)
        args.dtype = "bf16" if device.type == "cuda" else "fp32"
    config = _config(args)
    check_target_option(args.target)  # the paths first: a mistake there is named before the data's
    if args.draft and _needs(config, "draft"):
        check_draft_option(args.draft)
    datasets, buckets = _split(args.datasets, str, "--datasets"), _split(args.buckets, int, "--buckets")
    for name in datasets:  # a missing file fails now, not after minutes of loading
        select_eval_rows(Path(args.data_dir or default_eval_dir()) / f"{name}.jsonl", buckets, args.per_bucket)
    if args.plots and importlib.util.find_spec("matplotlib") is None:
        raise ImportError("plots need matplotlib: pip install 'transformers-longspec[bench]' (or --no-plots)")
    models, tokenizer = _load_models(args, config)
    limit = models.target.config.get_text_config().max_position_embeddings
    max_context = args.max_context or limit - args.max_new_tokens - 256
    prompts = load_prompts(tokenizer, datasets, buckets, args.per_bucket, args.data_dir, max_context, args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    options = {**{k: v for k, v in vars(args).items() if k != "func"}, "max_context": max_context}
    done: list = []

    def on_row(row) -> None:  # a run cut short (time limit, crash) still leaves its rows and a readable report
        done.append(row)
        print(json.dumps(asdict(row)), file=stream, flush=True)
        write_report(build_report(done, ["partial: written while the run was going"], options), out)

    with (out / "rows.jsonl").open("w") as stream:
        rows, notes = run_bench(models, prompts, config, on_row=on_row)
    report = build_report(rows, notes, options)
    write_report(report, out)
    if args.plots:
        plot_report(report, out)
    print(format_table(report["aggregates"]))
    for note in notes:
        print(f"note: {note}")
    return report


__all__ = ["add_bench_parser", "run_bench_command"]
