"""Compare a 1-GPU and an N-GPU run of `bench_distributed.py`: scaling, loss curves, memory; optional plot.

    python benchmarks/plot_distributed.py one_gpu.json two_gpu.json --summary summary.json --png loss_curves.png

Prints a Markdown table (for benchmarks/NOTES.md): tokens/s per GPU and scaling efficiency (per-GPU throughput
with N GPUs / with 1 GPU, same global batch and micro-batch per GPU), the loss curves' mean absolute gap against
the 1-GPU curve's own step-to-step noise, peak memory per GPU at each probed length, and the reload checks. The
PNG (1-GPU vs N-GPU loss per step, raw and smoothed, one panel per stage) needs matplotlib.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

STAGES = ("stage1", "stage2")


@dataclass
class PlotArgs:
    """Command line: the two result files and where to write the summary and the plot."""

    one: str
    many: str
    summary: str | None = None
    png: str | None = None
    smooth: int = 5


def _smoothed(values: list[float], width: int) -> list[float]:
    """Trailing moving average over `width` steps."""
    return [statistics.fmean(values[max(0, i + 1 - width) : i + 1]) for i in range(len(values))]


def _curve_gap(one: list[float], many: list[float]) -> dict:
    """Mean |gap| of the two loss curves vs the 1-GPU curve's own step-to-step noise (mean |delta|)."""
    n = min(len(one), len(many))
    gap = statistics.fmean(abs(a - b) for a, b in zip(one[:n], many[:n], strict=True))
    noise = statistics.fmean(abs(b - a) for a, b in zip(one[: n - 1], one[1:n], strict=True)) if n > 1 else 0.0
    tail = max(1, n // 5)
    return {"mean_abs_gap": gap, "one_gpu_step_noise": noise, "final_one": statistics.fmean(one[n - tail : n]),
            "final_many": statistics.fmean(many[n - tail : n]), "within_noise": gap <= noise}


def summarise(one: dict, many: dict) -> dict:
    """Scaling efficiency, loss-curve agreement and peak memory of a 1-GPU vs an N-GPU result."""
    out = {"gpus": many["world_size"], "gpu": many["gpu"]}
    for stage in STAGES:
        a, b = one[stage], many[stage]
        out[stage] = {
            "seq": a["seq"], "global_rows": a["global_rows"], "tokens_per_s_per_gpu_1": a["tokens_per_s_per_gpu"],
            "tokens_per_s_per_gpu_n": b["tokens_per_s_per_gpu"], "speedup": b["tokens_per_s"] / a["tokens_per_s"],
            "scaling_efficiency": b["tokens_per_s_per_gpu"] / a["tokens_per_s_per_gpu"],
            "peak_gb_1": max(g["peak_allocated_gb"] for g in a["per_gpu"]),
            "peak_gb_n": max(g["peak_allocated_gb"] for g in b["per_gpu"]),
            "loss": _curve_gap(a["losses"], b["losses"]),
        }
    out["memory"] = {
        length: {"peak_gb_1": max(g["peak_allocated_gb"] for g in one["memory"][length]["per_gpu"]),
                 "peak_gb_n": [round(g["peak_allocated_gb"], 2) for g in many["memory"][length]["per_gpu"]],
                 "tokens_per_s_per_gpu_1": one["memory"][length]["tokens_per_s_per_gpu"],
                 "tokens_per_s_per_gpu_n": many["memory"][length]["tokens_per_s_per_gpu"]}
        for length in many["memory"] if length in one["memory"]
    }
    out["reload"] = {"one": one.get("reload"), "many": many.get("reload")}
    return out


def markdown(summary: dict) -> str:
    """The summary as Markdown tables."""
    n = summary["gpus"]
    lines = [f"| stage | tokens/row | rows/step | tok/s/GPU 1 GPU | tok/s/GPU {n} GPUs | speed-up | efficiency | "
             "peak GB 1 / N | final loss 1 / N | mean gap / step noise |", "|" + "---|" * 10]
    for stage in STAGES:
        s, loss = summary[stage], summary[stage]["loss"]
        lines.append(
            f"| {stage} | {s['seq']} | {s['global_rows']} | {s['tokens_per_s_per_gpu_1']:,.0f} | "
            f"{s['tokens_per_s_per_gpu_n']:,.0f} | {s['speedup']:.2f}x | {s['scaling_efficiency']:.0%} | "
            f"{s['peak_gb_1']:.1f} / {s['peak_gb_n']:.1f} | {loss['final_one']:.3f} / {loss['final_many']:.3f} | "
            f"{loss['mean_abs_gap']:.3f} / {loss['one_gpu_step_noise']:.3f} |")
    lines += ["", f"| tokens/row (stage 2, 1 row/GPU) | peak GB 1 GPU | peak GB per GPU, {n} GPUs | "
              f"tok/s/GPU 1 / {n} |", "|---|---|---|---|"]
    for length, m in summary["memory"].items():
        lines.append(f"| {length} | {m['peak_gb_1']:.1f} | {m['peak_gb_n']} | "
                     f"{m['tokens_per_s_per_gpu_1']:,.0f} / {m['tokens_per_s_per_gpu_n']:,.0f} |")
    lines += ["", f"reload checks: {json.dumps(summary['reload'])}"]
    return "\n".join(lines)


def plot(one: dict, many: dict, path: str, smooth: int) -> None:
    """Loss per optimizer step, 1 GPU vs N GPUs, one panel per stage (raw thin, smoothed thick).

    Raises: ImportError naming matplotlib if it is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError("the loss plot needs matplotlib: pip install matplotlib (the summary does not)") from err
    fig, axes = plt.subplots(1, len(STAGES), figsize=(12, 4))
    for ax, stage in zip(axes, STAGES, strict=True):
        runs = ((one, "1 GPU", "tab:blue"), (many, f"{many['world_size']} GPUs (FSDP2)", "tab:red"))
        for result, label, color in runs:
            losses = result[stage]["losses"]
            steps = range(1, len(losses) + 1)
            ax.plot(steps, losses, color=color, alpha=0.3, linewidth=0.8)
            ax.plot(steps, _smoothed(losses, smooth), color=color, label=label, linewidth=2)
        ax.set_title(f"{stage}: {one[stage]['seq']} tokens x {one[stage]['global_rows']} rows per step")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("draft loss")
        ax.legend()
    fig.suptitle(f"LongSpec draft training, {one['gpu']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("one")
    parser.add_argument("many")
    parser.add_argument("--summary", default=None)
    parser.add_argument("--png", default=None)
    parser.add_argument("--smooth", type=int, default=5)
    args = PlotArgs(**vars(parser.parse_args()))
    one, many = (json.loads(Path(p).read_text()) for p in (args.one, args.many))
    summary = summarise(one, many)
    print(markdown(summary))
    if args.summary:
        Path(args.summary).write_text(json.dumps(summary, indent=1) + "\n")
    if args.png:
        plot(one, many, args.png, args.smooth)


if __name__ == "__main__":
    main()
