"""Loss curves (PNG) and τ tables (markdown) from the files `benchmarks/gpu_qwen.sh` leaves in its results folder.

Inputs, all optional (a missing one is reported and skipped), in `--results DIR`:

    train_main.json                  `longspec train` summary (longspec_training.json) of the main draft
    train_ablate_<variant>.json      the same for each ablation variant (full, noanchor, nonoisy)
    tau_main.json, tau_ablation.json `benchmarks/eval_lossless.py` outputs

Outputs in `--out DIR`: `loss_main.png`, `loss_ablation.png` (train loss per logging step as lines, eval loss as
markers, one colour per run) and `tau_tables.md` (a training table, then per evaluation file a table per dataset,
bucket and draft with the lossless verdict, τ and decode speeds, and for several drafts a τ pivot).

    python benchmarks/plot_training.py --results ~/qwen-results --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

ABLATION_LABELS = {
    "full": "anchor-offset + noisy (full)",
    "noanchor": "no anchor-offset",
    "nonoisy": "no flash noisy training",
}


def loss_curves(summary: dict) -> dict[str, list]:
    """Train and eval losses from a `longspec train` summary's Trainer `log_history`.

    Args:
        summary: the parsed longspec_training.json (needs `log_history`: dicts with `step` and `loss` or
            `eval_loss`; other entries, e.g. the final `train_runtime` one, are ignored).
    Returns: {"train_steps", "train_loss", "eval_steps", "eval_loss"}: lists of ints (optimizer steps) and floats
        (nats per token); an eval at a step already seen (the final `evaluate()`) is kept once.
    Raises: ValueError if the summary has no `log_history` (written by `longspec train` since this script).
    """
    if "log_history" not in summary:
        raise ValueError("this training summary has no log_history; re-run `longspec train` to record one")
    curves = {"train_steps": [], "train_loss": [], "eval_steps": [], "eval_loss": []}
    for entry in summary["log_history"]:
        if "loss" in entry:
            curves["train_steps"].append(entry["step"])
            curves["train_loss"].append(entry["loss"])
        if "eval_loss" in entry and entry["step"] not in curves["eval_steps"]:
            curves["eval_steps"].append(entry["step"])
            curves["eval_loss"].append(entry["eval_loss"])
    return curves


def plot_losses(runs: dict[str, dict], path: Path, title: str) -> None:
    """Write one PNG with the loss curves of `runs` ({label: training summary}).

    Raises: ImportError naming matplotlib if it is missing (pip install matplotlib).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (label, summary) in enumerate(runs.items()):
        curves, color = loss_curves(summary), f"C{i}"
        ax.plot(curves["train_steps"], curves["train_loss"], color=color, lw=1.2, label=f"{label}: train")
        if curves["eval_steps"]:
            ax.plot(curves["eval_steps"], curves["eval_loss"], color=color, ls="--", marker="o", ms=4,
                    label=f"{label}: eval")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("draft cross-entropy (nats / token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def training_table(runs: dict[str, dict]) -> str:
    """Markdown table: run, steps, last logged train loss, final eval loss, seconds (load, data, train)."""
    lines = ["| run | steps | last train loss | eval loss | load s | data s | train s |", "|---" * 7 + "|"]
    for label, summary in runs.items():
        curves, timings = loss_curves(summary), summary.get("timings_s", {})
        last = f"{curves['train_loss'][-1]:.3f}" if curves["train_loss"] else "-"
        lines.append(f"| {label} | {summary.get('steps', '-')} | {last} | {_num(summary.get('eval_loss'), 3)} | "
                     f"{_num(timings.get('load_s'), 0)} | {_num(timings.get('data_s'), 0)} | "
                     f"{_num(summary.get('train_runtime_s'), 0)} |")
    return "\n".join(lines)


def verdict(rows: list[dict]) -> str:
    """'n/n identical', plus near-tie divergences and, loudly, divergences that are not near-ties."""
    same = sum(r["identical"] for r in rows)
    ties = sum(bool(r.get("near_tie")) for r in rows if not r["identical"])
    other = len(rows) - same - ties
    text = f"{same}/{len(rows)} identical"
    text += f", {ties} near-tie" if ties else ""
    return text + (f", **{other} NOT near-tie**" if other else "")


def tau_table(result: dict) -> str:
    """Markdown table per (dataset, bucket, draft) of one eval_lossless output: verdict, τ, tok/s, ratio."""
    groups = defaultdict(list)
    for row in result["rows"]:
        groups[(row["dataset"], row["bucket"], row.get("draft", ""))].append(row)
    lines = ["| dataset | bucket | draft | prompt tokens | lossless (greedy) | τ | plain tok/s | LongSpec tok/s | "
             "ratio |", "|---|---|---|---|---|---|---|---|---|"]
    for (dataset, bucket, draft), rows in sorted(groups.items()):
        plain, spec = _mean(r["plain_tok_s"] for r in rows), _mean(r["longspec_tok_s"] for r in rows)
        ratio = _num(spec / plain if plain else None, 2)  # plain is NaN when a tiny run's timing was below noise
        lines.append(f"| {dataset} | {bucket} | {draft} | {_mean(r['prompt_tokens'] for r in rows):.0f} | "
                     f"{verdict(rows)} | {_mean(r['tau'] for r in rows):.2f} | {_num(plain, 1)} | {_num(spec, 1)} | "
                     f"{ratio if ratio == '-' else ratio + 'x'} |")
    return "\n".join(lines)


def divergence_table(result: dict) -> str:
    """Markdown table of every divergence: prompt, draft, first diverging new token, top-2 gap, near-tie."""
    rows = [r for r in result["rows"] if not r["identical"]]
    if not rows:
        return "No divergence: every LongSpec output equals plain greedy."
    lines = ["| prompt | draft | first divergence (new token #) | top-1 logit | top-2 gap | near-tie |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['id']} | {r.get('draft', '')} | {r['first_divergence']} | {_num(r.get('top1_logit'), 2)} "
                     f"| {_num(r.get('top2_gap'), 4)} | {'yes' if r.get('near_tie') else '**no**'} |")
    return "\n".join(lines)


def tau_pivot(result: dict) -> str:
    """Markdown table of mean τ: one row per draft, one column per dataset/bucket, plus the mean over columns."""
    cells = defaultdict(list)
    for row in result["rows"]:
        cells[(row.get("draft", ""), f"{row['dataset']} {row['bucket']}")].append(row["tau"])
    drafts = sorted({d for d, _ in cells})
    columns = sorted({c for _, c in cells})
    lines = ["| draft | " + " | ".join(columns) + " | mean |", "|---" * (len(columns) + 2) + "|"]
    for draft in drafts:
        taus = [_mean(cells[(draft, c)]) if cells[(draft, c)] else None for c in columns]
        known = [t for t in taus if t is not None]
        lines.append(f"| {draft} | " + " | ".join(_num(t, 2) for t in taus) + f" | {_num(_mean(known), 2)} |")
    return "\n".join(lines)


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def _num(value, digits: int) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _read(path: Path) -> dict | None:
    if not path.is_file():
        print(f"plot_training: {path} not found, skipped")
        return None
    return json.loads(path.read_text())


def report(results: Path, out: Path) -> list[Path]:
    """Write the PNGs and tau_tables.md for whatever is in `results`; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    main_run = _read(results / "train_main.json")
    ablation = {ABLATION_LABELS[v]: s for v in ABLATION_LABELS if (s := _read(results / f"train_ablate_{v}.json"))}
    written, sections = [], ["# Qwen2.5-Coder-1.5B-Instruct: LongSpec draft training and τ"]
    figures = (({"main": main_run} if main_run else {}, "loss_main.png", "Main draft (recipe qwen2.5-coder-1.5b-gpu)"),
               (ablation, "loss_ablation.png", "Ablation (recipe qwen2.5-coder-1.5b-ablation)"))
    for runs, name, title in figures:
        if runs:
            plot_losses(runs, out / name, title)
            written.append(out / name)
            sections += [f"## Training: {title}", training_table(runs)]
    for name in ("tau_main.json", "tau_ablation.json"):
        result = _read(results / name)
        if result is None:
            continue
        meta = result.get("meta", {})
        sections += [f"## {name}", f"dtype {meta.get('dtype')}, {meta.get('max_new_tokens')} new tokens, tree "
                     f"{meta.get('tree') or 'default'}, device {meta.get('device')}, commit {meta.get('commit')}, "
                     f"near-tie = top-2 gap <= {meta.get('near_tie_ulps')} ulp of the top logit",
                     tau_table(result), divergence_table(result)]
        if len({r.get("draft") for r in result["rows"]}) > 1:
            sections.append(tau_pivot(result))
    (out / "tau_tables.md").write_text("\n\n".join(sections) + "\n")
    return [*written, out / "tau_tables.md"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", type=Path, required=True, help="folder with train_*.json and tau_*.json")
    p.add_argument("--out", type=Path, required=True, help="folder for the PNGs and tau_tables.md")
    args = p.parse_args()
    for path in report(args.results, args.out):
        print(f"plot_training: wrote {path}")


if __name__ == "__main__":
    main()
