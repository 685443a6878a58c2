"""Benchmark report: aggregates per method and length bucket, the JSON file, a markdown table and PNG plots.

Aggregates (per method label × bucket, and over all buckets as bucket "all"): median decode tokens/s, median τ, median
peak memory, exactness counts of greedy methods against the reference (`sdpa`, else the first method), and for every
baseline method measured in the same run (same temperature) the median over prompts of the per-prompt ratio
decode_tok_s(method) / decode_tok_s(baseline) — ratios are taken prompt by prompt, never across runs. For LongSpec
methods, the step breakdown: median draft / verify / other ms per step, the plain loop's (`plain_graph`) ms per token
on the same prompts, and the predicted ratio τ × (plain token ms) / (step ms), to read beside the measured ratio over
`plain_graph` (`speedup_over`).

Reference: STYLE.md B19 (side by side in one process, ratio + τ reported); LongSpec (arXiv 2502.17421) §5.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
from dataclasses import asdict
from pathlib import Path

import torch

from .harness import DECODE_CLOCK, REFERENCE, TAU_DEFINITION, BenchRow

ALL_BUCKETS = "all"
PLAIN_LOOP = "plain_graph"  # the plain baseline a LongSpec step is held against


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _speedups(group: list[BenchRow], rows: list[BenchRow]) -> dict[str, float]:
    """{baseline label: median per-prompt ratio} for the rows of one method × bucket."""
    by_key = {(r.method, r.prompt_id): r for r in rows if r.decode_tok_s}
    baselines = sorted({r.method for r in rows if r.is_baseline and r.temperature == group[0].temperature})
    out = {}
    for base in baselines:
        if base == group[0].method:
            continue
        ratios = [r.decode_tok_s / by_key[base, r.prompt_id].decode_tok_s
                  for r in group if r.decode_tok_s and (base, r.prompt_id) in by_key]
        if ratios:
            out[base] = statistics.median(ratios)
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1e3 * seconds


def step_breakdown(group: list[BenchRow], rows: list[BenchRow]) -> dict | None:
    """Per-step costs of a LongSpec method × bucket beside the plain loop's token, or None for other methods.

    Args:
        group: rows of one method and bucket. rows: every row of the run (for the `plain_graph` rows).
    Returns: {"draft_ms", "verify_ms", "other_ms", "step_ms": medians per step (ms); "plain_token_ms": median of
        1000 / decode_tok_s of `plain_graph` on the same prompts (None if it did not run); "predicted_ratio":
        median per prompt of τ × plain_token_ms / step_ms; "measured_ratio": median per prompt of decode_tok_s /
        decode_tok_s(plain_graph)}.
    """
    steps = [r for r in group if r.draft_s_per_step is not None]
    if not steps:
        return None
    plain = {r.prompt_id: r.decode_tok_s for r in rows if r.method == PLAIN_LOOP and r.decode_tok_s}  # tok/s

    def step_s(r: BenchRow) -> float:
        return r.draft_s_per_step + r.verify_s_per_step + r.other_s_per_step

    mine = [r for r in steps if r.prompt_id in plain]
    return {
        "draft_ms": _ms(_median(r.draft_s_per_step for r in steps)),
        "verify_ms": _ms(_median(r.verify_s_per_step for r in steps)),
        "other_ms": _ms(_median(r.other_s_per_step for r in steps)),
        "step_ms": _ms(_median(step_s(r) for r in steps)),
        "plain_token_ms": _median(1e3 / plain[r.prompt_id] for r in mine),
        "predicted_ratio": _median(r.tau / (plain[r.prompt_id] * step_s(r)) for r in mine if r.tau),
        "measured_ratio": _median(r.decode_tok_s / plain[r.prompt_id] for r in mine if r.decode_tok_s),
    }


def _summarise(method: str, bucket, group: list[BenchRow], rows: list[BenchRow]) -> dict:
    ran = [r for r in group if r.new_tokens is not None]
    compared = [r for r in ran if r.identical is not None]
    mismatched = [r for r in compared if not r.identical]
    return {
        "method": method,
        "temperature": group[0].temperature,
        "bucket": bucket,
        "prompts": len(ran),
        "not_run": len(group) - len(ran),
        "median_decode_tok_s": _median(r.decode_tok_s for r in ran),
        "median_tau": _median(r.tau for r in ran),
        "median_peak_memory_bytes": _median(r.peak_memory_bytes for r in ran),
        "median_prefill_s": _median(r.prefill_s for r in ran),
        "speedup_over": _speedups(ran, rows) if ran else {},
        "compared": len(compared),
        "mismatches": len(mismatched),
        "near_tie_mismatches": sum(1 for r in mismatched if r.near_tie),
        "step": step_breakdown(ran, rows),
    }


def aggregate(rows: list[BenchRow]) -> list[dict]:
    """Aggregates per method label and bucket (tokens), then over all buckets (bucket "all").

    Args:
        rows: `run_bench` rows.
    Returns: list of dicts with method, temperature, bucket, prompts, not_run, median_decode_tok_s, median_tau,
        median_peak_memory_bytes, median_prefill_s, speedup_over {baseline: ratio}, compared, mismatches,
        near_tie_mismatches, step (`step_breakdown`, None for methods without LongSpec steps); in method order
        of first appearance, buckets ascending.
    """
    methods = list(dict.fromkeys(r.method for r in rows))
    out = []
    for method in methods:
        mine = [r for r in rows if r.method == method]
        for bucket in sorted({r.bucket for r in mine}):
            out.append(_summarise(method, bucket, [r for r in mine if r.bucket == bucket], rows))
        out.append(_summarise(method, ALL_BUCKETS, mine, rows))
    return out


def _git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def environment() -> dict:
    """Where the numbers come from: commit, date (UTC), device, torch / transformers / triton / Python versions.

    The commit is `git rev-parse --short HEAD` in the current folder, else `$LONGSPEC_COMMIT`, else None.
    """
    import transformers

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "commit": _git_commit() or os.environ.get("LONGSPEC_COMMIT"),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
    }


def build_report(rows: list[BenchRow], notes: list[str], args: dict) -> dict:
    """The JSON document: meta (environment, args, definitions), notes, per-run rows and aggregates."""
    meta = {**environment(), "args": args, "reference": REFERENCE, "decode_clock": DECODE_CLOCK,
            "tau": TAU_DEFINITION}
    return {"meta": meta, "notes": notes, "rows": [asdict(r) for r in rows], "aggregates": aggregate(rows)}


def _fmt(value, spec: str = ".1f") -> str:
    return "–" if value is None else format(value, spec)


def format_step_table(aggregates: list[dict]) -> str:
    """A markdown table of the LongSpec step breakdown per method × bucket ("" when no method has steps)."""
    head = ["method", "bucket", "draft ms", "verify ms", "other ms", "step ms", "τ", f"{PLAIN_LOOP} ms/token",
            "predicted ×", "measured ×"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a in aggregates:
        s = a.get("step")
        if s:
            cells = [a["method"], str(a["bucket"]), *[_fmt(s[k], ".2f") for k in ("draft_ms", "verify_ms", "other_ms",
                     "step_ms")], _fmt(a["median_tau"], ".2f"), _fmt(s["plain_token_ms"], ".2f"),
                     _fmt(s["predicted_ratio"], ".2f"), _fmt(s["measured_ratio"], ".2f")]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def format_table(aggregates: list[dict]) -> str:
    """A markdown table of the aggregates: one line per method × bucket, one `×BASELINE` column per baseline;
    then, for LongSpec methods, the step breakdown (`format_step_table`).

    A `×B` cell is the median per-prompt ratio decode_tok_s(method) / decode_tok_s(B); "–" where not measured.
    """
    bases = list(dict.fromkeys(b for a in aggregates for b in a["speedup_over"]))
    head = ["method", "bucket", "prompts", "decode tok/s", "τ", *[f"×{b}" for b in bases], "mismatches (near-ties)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a in aggregates:
        exact = f"{a['mismatches']}/{a['compared']} ({a['near_tie_mismatches']})" if a["compared"] else "–"
        cells = [a["method"], str(a["bucket"]), str(a["prompts"]), _fmt(a["median_decode_tok_s"]),
                 _fmt(a["median_tau"], ".2f"), *[_fmt(a["speedup_over"].get(b), ".2f") for b in bases], exact]
        lines.append("| " + " | ".join(cells) + " |")
    steps = format_step_table(aggregates)
    return "\n".join(lines) + (f"\n\nper LongSpec step:\n{steps}" if steps else "")


def method_colours(aggregates: list[dict]) -> dict[str, str]:
    """One matplotlib colour per method label, in order of first appearance (tab10, then tab20 beyond ten), so that a
    method has the same colour in every plot, also where it has no point (e.g. no τ)."""
    methods = list(dict.fromkeys(a["method"] for a in aggregates))
    cycle = [f"C{i}" for i in range(10)] if len(methods) <= 10 else [f"tab20:{i}" for i in range(20)]
    return {m: cycle[i % len(cycle)] for i, m in enumerate(methods)}


def plot_report(report: dict, out_dir: str | Path) -> list[Path]:
    """Two PNGs: median decode tokens/s and median τ against the length bucket, one line per method, each method in
    its own colour in both (`method_colours`).

    Args:
        report: a `build_report` document. out_dir: existing folder.
    Returns: the paths written (`decode_tok_s.png`, `tau.png`).
    Raises: ImportError naming the install command if matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError("plots need matplotlib: pip install 'transformers-longspec[bench]'") from err
    per_bucket = [a for a in report["aggregates"] if a["bucket"] != ALL_BUCKETS]
    buckets = sorted({a["bucket"] for a in per_bucket})
    x = {b: i for i, b in enumerate(buckets)}
    colours = method_colours(per_bucket)
    paths = []
    for key, ylabel, name in [("median_decode_tok_s", "decode tokens/s (median)", "decode_tok_s.png"),
                              ("median_tau", "τ (tokens per target forward, median)", "tau.png")]:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for method in dict.fromkeys(a["method"] for a in per_bucket):
            points = [(x[a["bucket"]], a[key]) for a in per_bucket if a["method"] == method and a[key] is not None]
            if points:
                ax.plot(*zip(*points), marker="o", label=method, color=colours[method])
        ax.set_xticks(range(len(buckets)), [str(b) if b else "short" for b in buckets])
        ax.set_xlabel("context bucket (tokens)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{report['meta']['device']}, commit {report['meta']['commit']}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(Path(out_dir) / name)
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


def write_report(report: dict, out_dir: str | Path) -> Path:
    """Write `bench.json` (the whole report, indented) into `out_dir` (created); returns its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench.json"
    path.write_text(json.dumps(report, indent=1))
    return path


def main(argv: list[str] | None = None) -> int:
    """`python -m transformers_longspec.bench.report OUT_DIR`: recompute the aggregates of `OUT_DIR/bench.json`
    (e.g. one cut short), rewrite it, redraw the plots and print the table. Returns the exit status."""
    import argparse

    parser = argparse.ArgumentParser(description="Rebuild the report of a `longspec bench` output folder.")
    parser.add_argument("out_dir", help="folder holding bench.json")
    args = parser.parse_args(argv)
    path = Path(args.out_dir) / "bench.json"
    report = json.loads(path.read_text())
    report["aggregates"] = aggregate([BenchRow(**row) for row in report["rows"]])
    path.write_text(json.dumps(report, indent=1))
    plot_report(report, args.out_dir)
    print(format_table(report["aggregates"]))
    return 0


__all__ = ["PLAIN_LOOP", "aggregate", "build_report", "environment", "format_step_table", "format_table", "main",
           "method_colours", "plot_report", "step_breakdown", "write_report"]


if __name__ == "__main__":
    raise SystemExit(main())
