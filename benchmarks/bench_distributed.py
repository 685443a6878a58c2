"""LongSpec draft training on 1 GPU or several (FSDP2): throughput, loss curves, peak memory, reload checks.

One process (1 GPU) or one per GPU under `accelerate launch` (the draft under FSDP2, the target sharded by
`LongSpecTrainer`), the same global batch either way so the loss curves compare:

    stage 1   packed 1024-token blocks, anchor-offset + noisy training, 16 rows per step      -> tokens/s, losses
    stage 2   16384-token rows continued from the stage-1 draft (saved + reloaded), 2 per step -> tokens/s, losses
    memory    a few stage-2 steps at each of --memory-lengths tokens (1 row per GPU)           -> peak GB per GPU
    reload    the stage-2 draft folder loads onto a whole target on one GPU (greedy generate with the draft vs
              without) and on the CPU (tensors equal to the file)

Text: installed torch + transformers sources (allowed training data), tokenized once into --tokens.
Results: one JSON (--out) from the main process; `plot_distributed.py` compares a 1-GPU and a 2-GPU file.

    python benchmarks/bench_distributed.py --target ~/qwen15 --out one_gpu.json
    accelerate launch --config_file trainers/distributed/fsdp2.yaml --num_processes 2 \\
        benchmarks/bench_distributed.py --target ~/qwen15 --out two_gpu.json
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import accelerate
import torch
import transformers
from accelerate import PartialState
from safetensors.torch import load_file
from transformers import TrainerCallback

import transformers_longspec  # noqa: F401  (generate hook)
from transformers_longspec import LongSpecDraft
from transformers_longspec.cli.models import load_target
from transformers_longspec.trainers import (
    LongSpecTrainer,
    LongSpecTrainingArguments,
    TokenCollator,
    pack_texts,
    python_package_sources,
    save_trained_draft,
)


@dataclass
class BenchConfig:
    """Command line of the benchmark (global batches are per optimizer step, over all GPUs)."""

    target: str
    out: str
    work: str = "/tmp/longspec_bench"
    tokens: str = ""  # token cache; "" = /tmp/longspec_bench_tokens_<vocab size>.pt
    stage1_steps: int = 80
    stage1_rows: int = 16
    stage1_micro: int = 8
    stage2_steps: int = 60
    stage2_seq: int = 16384
    stage2_rows: int = 2
    memory_lengths: str = "16384,32768"
    memory_steps: int = 3
    warmup: int = 5
    target_sharding: str = "auto"


CUDA = torch.cuda.is_available()  # False only for a CPU dry run of this script (fp32, no memory figures)


def _sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


class StepClock(TrainerCallback):
    """Seconds between optimizer steps (CUDA-synchronised) and the peak memory of this process's GPU."""

    def __init__(self):
        self.ends: list[float] = []

    def on_train_begin(self, args, state, control, **kwargs):
        _sync()
        if CUDA:
            torch.cuda.reset_peak_memory_stats()
        self.ends = [time.perf_counter()]

    def on_step_end(self, args, state, control, **kwargs):
        _sync()
        self.ends.append(time.perf_counter())

    def step_seconds(self) -> list[float]:
        return [b - a for a, b in zip(self.ends, self.ends[1:])]


def _parse() -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for f in fields(BenchConfig):
        required = f.name in ("target", "out")
        parser.add_argument("--" + f.name.replace("_", "-"), type=type(f.default) if not required else str,
                            required=required, default=None if required else f.default)
    return BenchConfig(**vars(parser.parse_args()))


def _token_stream(cfg: BenchConfig, tokenizer, state: PartialState) -> torch.Tensor:
    """Flat int64 token stream of package sources, enough for every phase; built once, cached in cfg.tokens."""
    lengths = [int(x) for x in cfg.memory_lengths.split(",") if x]
    needed = (cfg.stage1_steps * cfg.stage1_rows * 1024 + cfg.stage2_steps * cfg.stage2_rows * cfg.stage2_seq
              + sum(cfg.memory_steps * 2 * n for n in lengths) + 4096)
    path = Path(cfg.tokens or f"/tmp/longspec_bench_tokens_{len(tokenizer)}.pt")
    with state.main_process_first():
        if not path.exists() or torch.load(path).numel() < needed:
            if state.is_main_process:
                texts = python_package_sources(["torch", "transformers"], min_chars=500, shuffle_seed=0)
                blocks = pack_texts(texts, tokenizer, seq_length=4096, max_sequences=-(-needed // 4096))
                torch.save(torch.cat([b["input_ids"] for b in blocks]), path)
    stream = torch.load(path)
    if stream.numel() < needed:
        raise ValueError(f"only {stream.numel()} tokens of package sources, {needed} needed; lower the step counts")
    return stream


def _rows(stream: torch.Tensor, start: int, count: int, seq: int) -> tuple[list[dict], int]:
    """`count` rows of `seq` tokens from stream[start:], and the offset after them."""
    end = start + count * seq
    return [{"input_ids": row} for row in stream[start:end].view(count, seq)], end


def _args(cfg: BenchConfig, name: str, steps: int, rows: int, micro: int, world: int, **extra):
    accumulation = rows // (micro * world)
    if accumulation < 1 or accumulation * micro * world != rows:
        raise ValueError(f"{name}: {rows} rows per step do not split into {world} GPUs x micro-batches of {micro}")
    return LongSpecTrainingArguments(
        output_dir=f"{cfg.work}/{name}-{world}gpu", max_steps=steps, per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulation, bf16=CUDA, logging_steps=1, save_strategy="no", report_to=[],
        disable_tqdm=True, seed=42, adam_beta1=0.9, adam_beta2=0.95, adam_epsilon=1e-6, weight_decay=0.1,
        max_grad_norm=1.0, lr_scheduler_type="cosine", dataloader_num_workers=0,
        use_cpu=not CUDA, target_sharding=cfg.target_sharding, **extra)


def _train(cfg, target, draft, rows, args, save_to: str | None, state: PartialState) -> dict:
    """Train, then gather per-GPU step times and peaks; optionally save the draft (every process takes part)."""
    clock = StepClock()
    trainer = LongSpecTrainer(model=draft, target_model=target, args=args, train_dataset=rows,
                              data_collator=TokenCollator(pad_token_id=0), callbacks=[clock])
    trainer.train()
    if save_to:
        save_trained_draft(trainer, save_to)
    mine = {"peak_allocated_gb": torch.cuda.max_memory_allocated() / 2**30 if CUDA else 0.0,
            "peak_reserved_gb": torch.cuda.max_memory_reserved() / 2**30 if CUDA else 0.0}
    per_gpu = [mine]
    if state.num_processes > 1:
        per_gpu = [None] * state.num_processes
        torch.distributed.all_gather_object(per_gpu, mine)
    times = clock.step_seconds()
    times = times[min(cfg.warmup, len(times) - 1) :]  # warm-up steps excluded; short probes keep their last step
    seq = len(rows[0]["input_ids"])
    global_rows = args.per_device_train_batch_size * args.gradient_accumulation_steps * state.num_processes
    step_s = sorted(times)[len(times) // 2]
    tokens_per_s = global_rows * seq / step_s
    result = {
        "steps": args.max_steps, "seq": seq, "global_rows": global_rows,
        "accumulation": args.gradient_accumulation_steps, "micro_batch": args.per_device_train_batch_size,
        "median_step_s": step_s, "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_gpu": tokens_per_s / state.num_processes, "per_gpu": per_gpu,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
    }
    del trainer, draft
    gc.collect()
    if CUDA:
        torch.cuda.empty_cache()
    return result


def _stages(cfg: BenchConfig, target, stream: torch.Tensor, state: PartialState) -> dict:
    """Stage 1 from a new draft, stage 2 from the saved stage-1 draft, then the memory probes."""
    world, work = state.num_processes, Path(cfg.work)
    rows1, offset = _rows(stream, 0, cfg.stage1_steps * cfg.stage1_rows, 1024)
    args1 = _args(cfg, "stage1", cfg.stage1_steps, cfg.stage1_rows, cfg.stage1_micro, world, learning_rate=5e-4,
                  warmup_steps=0.05, loss_chunk_size=1024)
    stage1_dir = str(work / f"stage1-{world}gpu")
    out = {"stage1": _train(cfg, target, LongSpecDraft.from_target(target).float(), rows1, args1, stage1_dir, state)}
    state.print(f"stage 1: {out['stage1']['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, {out['stage1']['per_gpu']}")

    def stage2_draft():
        return LongSpecDraft.from_pretrained(stage1_dir, target_model=target, dtype=torch.float32)

    stage2 = {"learning_rate": 5e-5, "warmup_steps": 0.1, "loss_chunk_size": 2048, "gradient_checkpointing": True,
              "gradient_checkpointing_kwargs": {"use_reentrant": False}}
    rows2, offset = _rows(stream, offset, cfg.stage2_steps * cfg.stage2_rows, cfg.stage2_seq)
    args2 = _args(cfg, "stage2", cfg.stage2_steps, cfg.stage2_rows, 1, world, **stage2)
    out["stage2"] = _train(cfg, target, stage2_draft(), rows2, args2, str(work / f"stage2-{world}gpu"), state)
    state.print(f"stage 2: {out['stage2']['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, {out['stage2']['per_gpu']}")
    out["memory"] = {}
    for length in [int(x) for x in cfg.memory_lengths.split(",") if x]:
        rows, _ = _rows(stream, offset, cfg.memory_steps * world, length)
        args = _args(cfg, f"memory{length}", cfg.memory_steps, world, 1, world, **stage2)
        probe = _train(cfg, target, stage2_draft(), rows, args, None, state)
        out["memory"][str(length)] = {k: probe[k] for k in ("per_gpu", "median_step_s", "tokens_per_s_per_gpu")}
        state.print(f"memory {length}: {probe['per_gpu']}")
    return out


def _reload_checks(cfg: BenchConfig, stream: torch.Tensor, folder: Path) -> dict:
    """The saved stage-2 draft on one GPU (generate with it == without it) and on the CPU (tensors == file)."""
    saved = load_file(folder / "model.safetensors")
    whole, _ = load_target(cfg.target, torch.bfloat16 if CUDA else torch.float32, "cuda" if CUDA else "cpu")
    draft = LongSpecDraft.from_pretrained(folder, target_model=whole)
    prompt = stream[-2048:].view(1, -1).to(whole.device)
    mask = torch.ones_like(prompt)  # packed text holds the pad (= document separator) id: content, not padding
    plain = whole.generate(prompt, attention_mask=mask, max_new_tokens=64, do_sample=False)
    spec = whole.generate(prompt, attention_mask=mask, assistant_model=draft, max_new_tokens=64, do_sample=False)
    vocab_sized = sum(whole.config.vocab_size in t.shape for t in saved.values())  # 0: no embedding / LM head saved
    gpu = {"tensors": len(saved), "vocab_sized_tensors": vocab_sized, "tau": draft.last_generation_stats.tau,
           "generate_identical_bf16": bool(torch.equal(plain, spec))}
    del whole, draft
    cpu_target, _ = load_target(cfg.target, torch.float32, "cpu")
    cpu_draft = LongSpecDraft.from_pretrained(folder, target_model=cpu_target)
    state_dict = cpu_draft.state_dict()
    gpu["cpu_load_equal"] = set(state_dict) == set(saved) and all(
        torch.equal(state_dict[k], saved[k].float()) for k in saved)
    return gpu


def main() -> None:
    cfg = _parse()
    state = PartialState(cpu=not CUDA)
    Path(cfg.work).mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    device = "cuda" if CUDA and state.num_processes == 1 else "cpu"  # several processes: the trainer places it
    target, tokenizer = load_target(cfg.target, torch.bfloat16 if CUDA else torch.float32, device)
    stream = _token_stream(cfg, tokenizer, state)
    gpu = torch.cuda.get_device_name() if CUDA else "cpu"
    result = {"config": asdict(cfg), "world_size": state.num_processes, "gpu": gpu, "torch": torch.__version__,
              "transformers": transformers.__version__, "accelerate": accelerate.__version__,
              "load_s": time.perf_counter() - start}
    result.update(_stages(cfg, target, stream, state))
    if state.is_main_process:  # written before the reload checks too, so a cut run keeps its measurements
        result["train_s"] = time.perf_counter() - start
        Path(cfg.out).write_text(json.dumps(result, indent=1) + "\n")
        result["reload"] = _reload_checks(cfg, stream, Path(cfg.work) / f"stage2-{state.num_processes}gpu")
        result["total_s"] = time.perf_counter() - start
        Path(cfg.out).write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k not in ("config",)}, default=str)[:3000])
    state.wait_for_everyone()


if __name__ == "__main__":
    main()
