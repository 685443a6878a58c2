"""The GPU-lease report tools: loss curves / τ tables (benchmarks/plot_training.py) and the near-tie verdict of
benchmarks/eval_lossless.py, on synthetic result files and a tiny target."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from tiny_models import make_target

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    """Import benchmarks/<name>.py (a script folder, not a package) as module `benchmarks_<name>`."""
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


plot_training = _load("plot_training")
eval_lossless = _load("eval_lossless")


def _summary(losses, evals, **extra):
    history = [{"loss": loss, "step": 10 * (i + 1)} for i, loss in enumerate(losses)]
    history += [{"eval_loss": loss, "step": step} for step, loss in evals]
    history.append({"train_runtime": 1.0, "train_loss": sum(losses) / len(losses), "step": 10 * len(losses)})
    return {"steps": 10 * len(losses), "eval_loss": evals[-1][1], "train_runtime_s": 12.0,
            "timings_s": {"load_s": 2.0, "data_s": 3.0}, "log_history": history, **extra}


def _row(draft, identical=True, tau=2.0, near_tie=None, bucket=16384, dataset="code_completion"):
    return {"id": f"p-{bucket}", "dataset": dataset, "bucket": bucket, "prompt_tokens": bucket, "new_tokens": 128,
            "identical": identical, "draft": draft, "first_divergence": None if identical else 7,
            "top2_gap": None if identical else 0.125, "top1_logit": None if identical else 20.0,
            "near_tie": near_tie, "tau": tau, "histogram": {}, "plain_tok_s": 20.0, "longspec_tok_s": 40.0}


def test_loss_curves_reads_log_history():
    curves = plot_training.loss_curves(_summary([9.0, 5.0, 4.0], [(20, 4.5), (30, 4.2), (30, 4.2)]))
    assert curves == {"train_steps": [10, 20, 30], "train_loss": [9.0, 5.0, 4.0], "eval_steps": [20, 30],
                      "eval_loss": [4.5, 4.2]}
    with pytest.raises(ValueError, match="log_history"):
        plot_training.loss_curves({"steps": 3})


def _ablation_result():
    rows = [_row("ablate-full", tau=2.5), _row("ablate-noanchor", identical=False, tau=1.5, near_tie=True),
            _row("ablate-full", bucket=30000, identical=False, near_tie=False, tau=2.0)]
    return {"meta": {"dtype": "bfloat16"}, "rows": rows}


def test_tables():
    text = plot_training.training_table({"main": _summary([9.0, 5.0], [(20, 4.5)])})
    assert "| main | 20 | 5.000 | 4.500 | 2 | 3 | 12 |" in text
    text = plot_training.tau_table(_ablation_result())
    assert "0/1 identical, 1 near-tie" in text and "0/1 identical, **1 NOT near-tie**" in text
    assert "| code_completion | 16384 | ablate-full | 16384 | 1/1 identical | 2.50 | 20.0 | 40.0 | 2.00x |" in text
    text = plot_training.tau_pivot(_ablation_result())
    assert "| draft | code_completion 16384 | code_completion 30000 | mean |" in text
    assert "| ablate-noanchor | 1.50 | - | 1.50 |" in text
    text = plot_training.divergence_table(_ablation_result())
    assert "| p-30000 | ablate-full | 7 | 20.00 | 0.1250 | **no** |" in text


def test_report_writes_plots_and_tables(tmp_path):
    pytest.importorskip("matplotlib")
    results, out = tmp_path / "res", tmp_path / "out"
    results.mkdir()
    (results / "train_main.json").write_text(json.dumps(_summary([9.0, 5.0], [(20, 4.5)])))
    for variant in ("full", "noanchor"):
        (results / f"train_ablate_{variant}.json").write_text(json.dumps(_summary([9.0, 6.0], [(20, 5.0)])))
    (results / "tau_ablation.json").write_text(json.dumps(_ablation_result()))
    written = plot_training.report(results, out)
    assert [p.name for p in written] == ["loss_main.png", "loss_ablation.png", "tau_tables.md"]
    assert all(p.stat().st_size > 1000 for p in written[:2])
    text = (out / "tau_tables.md").read_text()
    assert "no flash noisy training" not in text and "| no anchor-offset | 20 | 6.000 | 5.000 |" in text
    assert "**1 NOT near-tie**" in text and "| ablate-noanchor | 1.50 | - | 1.50 |" in text


def test_near_tie_verdict_on_a_tiny_target():
    target = make_target("qwen2")
    ids = torch.randint(3, 99, (1, 10), generator=torch.Generator().manual_seed(0))
    plain = target.generate(ids, do_sample=False, max_new_tokens=4)
    assert eval_lossless._compare(target, plain, plain.clone(), 10, 4.0) == {"identical": True}
    other = plain.clone()
    other[0, 12] = (other[0, 12] + 1) % 99
    result = eval_lossless._compare(target, plain, other, 10, 4.0)
    with torch.no_grad():
        logits = target(plain[:, :12]).logits[0, -1]
    top = logits.topk(2).values
    assert result["first_divergence"] == 2 and math.isclose(result["top2_gap"], float(top[0] - top[1]), rel_tol=1e-5)
    assert result["near_tie"] is (result["top2_gap"] <= 4 * eval_lossless.ulp(float(top[0]), torch.float32))
    assert eval_lossless.ulp(20.0, torch.bfloat16) == 0.125 and eval_lossless.ulp(-40.0, torch.bfloat16) == 0.25
