"""Benchmark harness: every decoding method on the same prompts and the same loaded target, in one process.

A method is a row of `METHODS` (name → `Method`, i.e. how to call `target.generate`); `--variant` adds more without
code. For every prompt the reference `sdpa` (vanilla `generate`) runs first, then each other method; per method ×
prompt the harness records decode tokens/s with the prefill excluded, τ, LongSpec's draft / verify / other seconds
per step, peak GPU memory and the prefill time. Greedy outputs are compared token by token with `sdpa`; at a first
divergence the target's top-2 logit gap (plain forward over the common prefix) tells a numerical near-tie (bf16
rounding flips the winner) from a real error. Aggregates per method and length bucket: median decode tokens/s,
median τ and the median per-prompt speed-up over every baseline method measured in the same run.

Decode clock (same for every method): decode_tok_s = (new_tokens − 1) / (T(N) − T(1)), where T(k) is the wall time
of `generate(..., max_new_tokens=k)` on the same prompt with the device synchronised before and after; the prefill
and the first token cancel out (as in reference/h200-baselines.md).

Reference: LongSpec (arXiv 2502.17421) §5 (speed-up over vanilla decoding, τ); transformers
`GenerationMixin.generate` (assisted generation, prompt lookup, `cache_implementation="static"` + torch.compile).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from . import compat
from .demo import eval_prompt

REFERENCE = "sdpa"
DECODE_CLOCK = (
    "decode_tok_s = (new_tokens - 1) / (T(N) - T(1)); T(k) = wall seconds of generate(max_new_tokens=k) on the same "
    "prompt, device synchronised before and after: prefill and first token cancel"
)
TAU_DEFINITION = (
    "LongSpec: mean tokens emitted per verification forward (LongSpecStats.tau); other methods: new tokens per "
    "target forward (forward hook; assisted generation verifies prompt + first candidates in its first forward); "
    "null where forwards are not counted (compiled static-cache forward)"
)


@dataclass
class BenchModels:
    """The models a benchmark runs with.

    Attributes:
        target: the target `*ForCausalLM` (eval mode), loaded once for every method.
        draft: an attached `LongSpecDraft` or None (methods that need it are skipped with a note).
        assistant: a small `*ForCausalLM` with the target's vocabulary for HF assisted generation, or None.
    """

    target: torch.nn.Module
    draft: torch.nn.Module | None = None
    assistant: torch.nn.Module | None = None


@dataclass(frozen=True)
class Method:
    """How one method calls `target.generate`.

    Attributes:
        generate_kwargs: (models, temperature or None) → extra `generate` kwargs (do_sample, assistant_model, ...).
        requires: "draft" or "assistant" when the method needs that model, else None.
        attn_implementation: switch the target's attention for this method ("eager", ...), restored afterwards.
        static_cache: a compiled static-cache method: target forwards not counted, static cache sized to each
            prompt.
        warm_up: one untimed generate of the full length per prompt before the timed calls (its wall seconds are
            reported as compile_s): compiled code, CUDA graphs and buffers for that prompt's lengths are ready, as
            in a server that has seen such a request (the static-cache baseline compiles then; LongSpec's
            static-shape step captures a graph pair per 512-token bucket of the committed length).
        sampling: runs once per `BenchConfig.temperatures` entry, seeded; outputs are not compared with `sdpa`.
        baseline: other methods report their speed-up over this one (at the same temperature).
    """

    generate_kwargs: Callable[[BenchModels, float | None], dict]
    requires: str | None = None
    attn_implementation: str | None = None
    static_cache: bool = False
    warm_up: bool = False
    sampling: bool = False
    baseline: bool = False


def _sampling(temperature: float | None) -> dict:
    # pure temperature sampling: top-k / top-p off, whatever the model's generation_config says
    return {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}


METHODS: dict[str, Method] = {
    "sdpa": Method(lambda m, t: {"do_sample": False}, baseline=True),
    "eager": Method(lambda m, t: {"do_sample": False}, attn_implementation="eager", baseline=True),
    "static_compile": Method(lambda m, t: {"do_sample": False, "cache_implementation": "static"},
                             static_cache=True, warm_up=True, baseline=True),
    "assisted": Method(lambda m, t: {"do_sample": False, "assistant_model": m.assistant}, requires="assistant",
                       baseline=True),
    "prompt_lookup": Method(lambda m, t: {"do_sample": False, "prompt_lookup_num_tokens": 10}, baseline=True),
    "longspec": Method(lambda m, t: {"do_sample": False, "assistant_model": m.draft}, requires="draft", warm_up=True),
    "sample": Method(lambda m, t: _sampling(t), sampling=True, baseline=True),
    "longspec_sample": Method(lambda m, t: {**_sampling(t), "assistant_model": m.draft}, requires="draft",
                              warm_up=True, sampling=True),
}


def parse_variant(spec: str, known: dict[str, Method] | None = None) -> tuple[str, Method]:
    """A method variant from `NAME=BASE:JSON`, e.g. `longspec_small=longspec:{"longspec_beam_widths": [4, 8, 8]}`.

    The JSON object's keys are extra `generate` kwargs, except "attn_implementation", which switches the target's
    attention for the variant (e.g. `longspec_eager=longspec:{"attn_implementation": "eager"}`). A variant is not a
    baseline.

    Args:
        spec: the text above. known: methods BASE may name (default `METHODS`).
    Returns: (NAME, Method).
    Raises: ValueError for a malformed spec, an unknown BASE or JSON that is not an object.
    """
    known = METHODS if known is None else known
    name, _, rest = spec.partition("=")
    base, _, text = rest.partition(":")
    if not name or not base or not text:
        raise ValueError(f"--variant takes NAME=BASE:JSON, e.g. 'lsw=longspec:{{\"longspec_beam_widths\": [4, 8]}}'; "
                         f"got {spec!r}")
    if base not in known:
        raise ValueError(f"--variant {name}: unknown base method {base!r}; known: {', '.join(known)}")
    try:
        extra = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"--variant {name}: {text!r} is not JSON ({err.msg})") from None
    if not isinstance(extra, dict):
        raise ValueError(f"--variant {name}: the JSON must be an object of generate kwargs, got {text!r}")
    parent = known[base]
    attn = extra.pop("attn_implementation", parent.attn_implementation)
    return name, replace(parent, generate_kwargs=lambda m, t: {**parent.generate_kwargs(m, t), **extra},
                         attn_implementation=attn, baseline=False)


@dataclass
class BenchConfig:
    """What to run.

    Attributes:
        methods: method names (from `METHODS` or `variants`); `sdpa` is the exactness reference and runs first.
        temperatures: sampling temperatures; each sampling method runs once per temperature.
        max_new_tokens: tokens to generate per call (N of the decode clock).
        seed: `torch.manual_seed` before every generate call.
        near_tie_gap: a divergence whose top-2 logit gap is ≤ this (logit units) is classified as a near-tie.
        eager_max_context: eager attention is skipped for prompts longer than this many tokens (its prefill
            materialises a (n_heads, prompt, prompt) fp32 score matrix per layer); None = never skipped.
        max_seconds: start no new prompt after this many wall seconds (partial results are kept); None = no limit.
        warmup: one short untimed generate per method before the first prompt (CUDA context, Triton JIT).
        variants: extra methods by name (see `parse_variant`).
    """

    methods: tuple[str, ...] = (REFERENCE, "longspec")
    temperatures: tuple[float, ...] = (1.0,)
    max_new_tokens: int = 256
    seed: int = 0
    near_tie_gap: float = 0.25
    eager_max_context: int | None = 16384
    max_seconds: float | None = None
    warmup: bool = True
    variants: dict[str, Method] = field(default_factory=dict)


@dataclass
class Prompt:
    """One benchmark prompt. ids: (1, prompt_len) int64 on the target's device; bucket: nominal length (tokens)."""

    id: str
    dataset: str
    bucket: int
    ids: torch.Tensor


@dataclass
class BenchRow:
    """One method × prompt measurement (a JSON row). Seconds are wall-clock; memory in bytes; None = not measured.

    Attributes:
        method: run label (`name`, or `name@temperature` for sampling). temperature: None for greedy.
        is_baseline: speed-ups of other methods are reported over this one.
        prompt_id, dataset, bucket, prompt_tokens: the prompt (bucket and prompt_tokens in tokens).
        new_tokens: tokens generated by the timed call. decode_s = T(N) − T(1); decode_tok_s (see `DECODE_CLOCK`).
        prefill_s: T(1), prefill + first token. compile_s: the untimed warm-up call (`Method.warm_up`).
        tau, target_forwards: see `TAU_DEFINITION`. steps: LongSpec verification steps. tree: its beam widths.
        draft_s_per_step, verify_s_per_step, other_s_per_step: LongSpec phases per step (`LongSpecStats`).
        longspec_decode_tok_s: LongSpec's own clock (`LongSpecStats.decode_tokens_per_s`), a cross-check.
        peak_memory_bytes: `torch.cuda.max_memory_allocated` during the timed call (CUDA only).
        identical: greedy output equals `sdpa`'s (None: not compared). first_divergence: new-token index.
        top2_gap: target's top-1 − top-2 logit at that step (plain forward on `sdpa`'s prefix). near_tie:
            top2_gap ≤ `near_tie_gap`. divergence_tokens: [sdpa's token, this method's token] (None past an end).
        skipped, error: why the method did not run on this prompt.
    """

    method: str
    temperature: float | None
    is_baseline: bool
    prompt_id: str
    dataset: str
    bucket: int
    prompt_tokens: int
    new_tokens: int | None = None
    decode_tok_s: float | None = None
    decode_s: float | None = None
    prefill_s: float | None = None
    compile_s: float | None = None
    tau: float | None = None
    target_forwards: int | None = None
    steps: int | None = None
    tree: list | None = None
    draft_s_per_step: float | None = None
    verify_s_per_step: float | None = None
    other_s_per_step: float | None = None
    longspec_decode_tok_s: float | None = None
    peak_memory_bytes: int | None = None
    identical: bool | None = None
    first_divergence: int | None = None
    top2_gap: float | None = None
    near_tie: bool | None = None
    divergence_tokens: list | None = None
    skipped: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class _Run:
    label: str
    name: str
    method: Method
    temperature: float | None


def default_eval_dir() -> Path:
    """`$LONGSPEC_EVAL_DIR`, else `shared/data/eval` beside the repository checkout this file sits in."""
    if os.environ.get("LONGSPEC_EVAL_DIR"):
        return Path(os.environ["LONGSPEC_EVAL_DIR"])
    return Path(__file__).resolve().parents[3] / "shared" / "data" / "eval"


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
        max_context: truncate each context to this many tokens (None = whole). device: where the ids go.
    Returns: list of `Prompt`, sorted by prompt length (tokens).
    Raises: FileNotFoundError for a missing file; ValueError for a row without context.
    """
    data_dir = Path(data_dir) if data_dir else default_eval_dir()
    prompts = []
    for name in datasets:
        for row in select_eval_rows(data_dir / f"{name}.jsonl", buckets, per_bucket):
            ids = eval_prompt(row, tokenizer, max_context).to(device)
            prompts.append(Prompt(id=row["_id"], dataset=name, bucket=int(row.get("bucket", 0)), ids=ids))
    return sorted(prompts, key=lambda p: p.ids.shape[1])


def timed_call(fn: Callable, device: torch.device | str = "cpu"):
    """Run `fn()` and return (its result, wall seconds), synchronising a CUDA device before and after."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - start


def first_divergence(reference: torch.Tensor, other: torch.Tensor, prompt_len: int) -> int | None:
    """Index among the new tokens (0 = first generated) of the first difference between two outputs.

    Args:
        reference, other: (1, prompt_len + new) int64 `generate` outputs for the same prompt.
        prompt_len: prompt tokens.
    Returns: None if the outputs are identical; if one output is a strict prefix of the other (it stopped
        earlier), the index where the shorter one ends.
    """
    length = min(reference.shape[1], other.shape[1])
    diff = (reference[0, :length] != other[0, :length].to(reference.device)).nonzero()
    if diff.numel():
        return int(diff[0]) - prompt_len
    return None if reference.shape[1] == other.shape[1] else length - prompt_len


def top2_logits(target, sequence: torch.Tensor, position: int) -> tuple[float, float]:
    """Top-1 and top-2 logits of the target's next-token prediction after `sequence[:, :position]`.

    One plain forward over the prefix (the target's current attention implementation, no cache, only the last
    position's logits), so a divergence can be classified: a gap of a bf16 rounding step or two is a near-tie.

    Args:
        target: `*ForCausalLM`. sequence: (1, ≥ position) int64. position: prefix length (tokens), ≥ 1.
    Returns: (top-1, top-2) in logit units (fp32).
    Reference: LongSpec §5 lossless check; transformers `logits_to_keep`.
    """
    with torch.no_grad():
        logits = target(input_ids=sequence[:, :position], logits_to_keep=1).logits[0, -1].float()
    top = logits.topk(2).values.tolist()
    return top[0], top[1]


def top2_logit_gap(target, sequence: torch.Tensor, position: int) -> float:
    """Top-1 minus top-2 logit after `sequence[:, :position]` (see `top2_logits`)."""
    top1, top2 = top2_logits(target, sequence, position)
    return top1 - top2


def _expand_runs(config: BenchConfig, models: BenchModels) -> tuple[list[_Run], list[str]]:
    """Runs in order (reference first), one per temperature for sampling methods; notes for skipped methods."""
    known = {**METHODS, **config.variants}
    unknown = [m for m in config.methods if m not in known]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; known: {', '.join(known)}")
    names = sorted(dict.fromkeys(config.methods), key=lambda m: m != REFERENCE)
    runs, notes = [], []
    for name in names:
        method = known[name]
        if method.requires and getattr(models, method.requires) is None:
            flag = "--draft" if method.requires == "draft" else "--assistant"
            notes.append(f"{name}: skipped, no {method.requires} model (give {flag})")
            continue
        if method.sampling and not config.temperatures:
            raise ValueError(f"method {name} samples: give --temperatures, e.g. 1.0,0.7")
        temps = config.temperatures if method.sampling else (None,)
        runs += [_Run(name if t is None else f"{name}@{t:g}", name, method, t) for t in temps]
    if REFERENCE not in names:
        notes.append(f"no {REFERENCE} run: greedy outputs are not compared")
    return runs, notes


@contextmanager
def _count_forwards(module: torch.nn.Module, enabled: bool) -> Iterator[list[int]]:
    """Count `module`'s forward calls inside the block (forward hook); yields a one-item list."""
    count = [0]
    handle = module.register_forward_hook(lambda *_: count.__setitem__(0, count[0] + 1)) if enabled else None
    try:
        yield count
    finally:
        if handle is not None:
            handle.remove()


def _generate(models: BenchModels, prompt: Prompt, run: _Run, kwargs: dict, max_new_tokens: int, seed: int):
    """One seeded, timed `generate`; returns (output ids, seconds)."""
    target = models.target
    if run.method.static_cache:
        compat.forget_static_cache_length(target)
    torch.manual_seed(seed)
    mask = torch.ones_like(prompt.ids)

    def call():
        return target.generate(prompt.ids, attention_mask=mask, max_new_tokens=max_new_tokens, **kwargs)

    return timed_call(call, prompt.ids.device)


def _fill_longspec_stats(row: BenchRow, stats) -> None:
    steps = len(stats.accepted_lengths)
    row.tau, row.target_forwards, row.steps = stats.tau, stats.target_forwards, steps
    row.tree = list(stats.beam_widths)
    row.longspec_decode_tok_s = stats.decode_tokens_per_s
    if steps:
        other = stats.total_s - stats.prefill_s - stats.draft_s - stats.verify_s
        row.draft_s_per_step, row.verify_s_per_step = stats.draft_s / steps, stats.verify_s / steps
        row.other_s_per_step = other / steps


def _timed_runs(models: BenchModels, prompt: Prompt, run: _Run, config: BenchConfig, row: BenchRow) -> torch.Tensor:
    """Warm-up (static cache), T(1), then T(N) with memory and forward counting; fills `row`, returns the output."""
    kwargs = run.method.generate_kwargs(models, run.temperature)
    if run.method.warm_up:
        _, row.compile_s = _generate(models, prompt, run, kwargs, config.max_new_tokens, config.seed)
    _, row.prefill_s = _generate(models, prompt, run, kwargs, 1, config.seed)
    cuda = prompt.ids.is_cuda
    if cuda:
        torch.cuda.reset_peak_memory_stats(prompt.ids.device)
    with _count_forwards(models.target, not run.method.static_cache) as forwards:
        out, total = _generate(models, prompt, run, kwargs, config.max_new_tokens, config.seed)
    row.peak_memory_bytes = torch.cuda.max_memory_allocated(prompt.ids.device) if cuda else None
    row.new_tokens = out.shape[1] - prompt.ids.shape[1]
    row.decode_s = total - row.prefill_s
    if row.new_tokens > 1 and row.decode_s > 0:
        row.decode_tok_s = (row.new_tokens - 1) / row.decode_s
    if models.draft is not None and kwargs.get("assistant_model") is models.draft:
        _fill_longspec_stats(row, models.draft.last_generation_stats)
    elif not run.method.static_cache:
        row.target_forwards = forwards[0]
        row.tau = row.new_tokens / forwards[0] if forwards[0] else None
    return out


def _measure(models: BenchModels, prompt: Prompt, run: _Run, config: BenchConfig):
    """One method on one prompt; returns (row, output ids or None if it did not run)."""
    row = BenchRow(method=run.label, temperature=run.temperature, is_baseline=run.method.baseline,
                   prompt_id=prompt.id, dataset=prompt.dataset, bucket=prompt.bucket,
                   prompt_tokens=prompt.ids.shape[1])
    limit = config.eager_max_context
    if run.method.attn_implementation == "eager" and limit is not None and row.prompt_tokens > limit:
        row.skipped = f"prompt of {row.prompt_tokens} tokens > eager_max_context {limit}"
        return row, None
    attention = run.method.attn_implementation
    try:
        with compat.attention_implementation(models.target, attention) if attention else nullcontext():
            return row, _timed_runs(models, prompt, run, config, row)
    except (RuntimeError, ValueError) as err:  # torch.OutOfMemoryError is a RuntimeError
        row.error = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"
        print(f"warning: {run.label} on {prompt.id}: {row.error}", file=sys.stderr)
        if prompt.ids.is_cuda:
            torch.cuda.empty_cache()
        return row, None


def _compare(row: BenchRow, target, reference: torch.Tensor, output: torch.Tensor, config: BenchConfig) -> None:
    """Fill the exactness fields of a greedy row against the reference output."""
    index = first_divergence(reference, output, row.prompt_tokens)
    row.identical = index is None
    if index is None:
        return
    position = row.prompt_tokens + index
    row.first_divergence = index
    row.divergence_tokens = [int(t[0, position]) if position < t.shape[1] else None for t in (reference, output)]
    if position < reference.shape[1]:
        row.top2_gap = top2_logit_gap(target, reference, position)
        row.near_tie = row.top2_gap <= config.near_tie_gap


def _warm_up(models: BenchModels, runs: list[_Run], prompt: Prompt, config: BenchConfig) -> None:
    """One short untimed generate per non-static method (CUDA context, cuBLAS handles, Triton JIT)."""
    short = Prompt(prompt.id, prompt.dataset, prompt.bucket, prompt.ids[:, -64:])
    small = replace(config, max_new_tokens=8, eager_max_context=None)
    for run in runs:
        if not run.method.static_cache:
            _measure(models, short, run, small)


def run_bench(models: BenchModels, prompts: list[Prompt], config: BenchConfig,
              on_row: Callable[[BenchRow], None] | None = None) -> tuple[list[BenchRow], list[str]]:
    """Run every method of `config` on every prompt (prompt by prompt, `sdpa` first) and compare greedy outputs.

    Args:
        models: target (+ draft, assistant). prompts: see `load_prompts`. config: see `BenchConfig`.
        on_row: called with each finished row (e.g. to append it to a JSONL file as the run goes).
    Returns: (rows, notes): one `BenchRow` per run × prompt in execution order; notes about skipped methods or a
        run cut by `max_seconds`.
    Raises: ValueError for an unknown method, or a sampling method without temperatures. Errors inside one
        generate call (out of memory, an unsupported option) are recorded in that row instead.
    """
    runs, notes = _expand_runs(config, models)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if config.warmup and prompts:
        _warm_up(models, runs, prompts[0], config)
    rows, start = [], time.perf_counter()
    for done, prompt in enumerate(prompts):
        if config.max_seconds is not None and time.perf_counter() - start > config.max_seconds:
            notes.append(f"stopped after {done} of {len(prompts)} prompts (max_seconds={config.max_seconds})")
            break
        reference = None
        for run in runs:
            print(f"bench: prompt {done + 1}/{len(prompts)} ({prompt.id}, {prompt.ids.shape[1]} tokens): {run.name}",
                  file=sys.stderr, flush=True)
            row, output = _measure(models, prompt, run, config)
            if run.name == REFERENCE:
                reference = output
            elif output is not None and reference is not None and not run.method.sampling:
                _compare(row, models.target, reference, output, config)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows, notes


__all__ = [
    "BenchConfig",
    "BenchModels",
    "BenchRow",
    "DECODE_CLOCK",
    "METHODS",
    "Method",
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
