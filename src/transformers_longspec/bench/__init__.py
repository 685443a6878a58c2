"""Benchmark harness of `longspec bench`: every decoding method on the same prompts and the same loaded target.

    harness     run_bench, BenchConfig, BenchRow: the run, its clock and its rows
    methods     METHODS, Method, BenchModels, parse_variant: how each method decodes
    plain_graph PlainGraphLoop: the static-cache greedy loop replayed from a CUDA graph (strongest plain baseline)
    prompts     Prompt, load_prompts, select_eval_rows, default_eval_dir: the evaluation rows as token ids
    exactness   first_divergence, top2_logits: a greedy output against the reference
    report      aggregates, bench.json, the markdown table and plots (`python -m transformers_longspec.bench.report`)

Reference: LongSpec (arXiv 2502.17421) §5 (speed-up over vanilla decoding, τ).
"""

from .exactness import first_divergence, top2_logit_gap, top2_logits
from .harness import DECODE_CLOCK, REFERENCE, TAU_DEFINITION, BenchConfig, BenchRow, run_bench, timed_call
from .methods import METHODS, BenchModels, Method, parse_variant
from .plain_graph import PlainGraphLoop
from .prompts import Prompt, default_eval_dir, load_prompts, select_eval_rows

__all__ = [
    "BenchConfig",
    "BenchModels",
    "BenchRow",
    "DECODE_CLOCK",
    "METHODS",
    "Method",
    "PlainGraphLoop",
    "Prompt",
    "REFERENCE",
    "TAU_DEFINITION",
    "default_eval_dir",
    "first_divergence",
    "load_prompts",
    "parse_variant",
    "run_bench",
    "select_eval_rows",
    "timed_call",
    "top2_logit_gap",
    "top2_logits",
]
