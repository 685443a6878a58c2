"""Where a LongSpec step's time goes, on a random-weight target of a real shape (GPU; no model download needed).

    python benchmarks/step_profile.py --shape qwen2.5-1.5b --contexts 8192,16384,30000 --out step_profile.json

For each context: plain greedy `generate` (sdpa), the strongest plain loop (`plain_graph`: static cache, one-token
step compiled and replayed from a CUDA graph) and LongSpec with eager steps, with static shapes + CUDA graphs, and
with static shapes + CUDA graphs + compiled regions (`longspec_compile`, the GPU default), same prompt, same
untrained draft (so τ is near 1: the numbers are per STEP, not per token). Reports ms per step (draft / verify /
other = acceptance, compaction, stopping, host), the plain loop's ms per token beside it and the ratio a draft of
acceptance τ would give, τ × (plain-loop token ms) / (step ms) (`predicted_ratio_per_tau`: that ratio for τ = 1;
multiply by the real draft's τ), the first-call cost of graph capture, peak memory, and whether each LongSpec
output equals plain greedy (random weights in bf16 have many near-ties, so a mismatch here is not by itself a bug; the
exactness checks are the tests and the real-model runs).
"""

from __future__ import annotations

import argparse
import json

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from transformers_longspec import LongSpecDraft
from transformers_longspec.bench import PlainGraphLoop, timed_call

SHAPES = {
    "qwen2.5-1.5b": (Qwen2Config, dict(hidden_size=1536, intermediate_size=8960,
                     num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                     max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=False)),
    "llama-3-8b": (LlamaConfig, dict(hidden_size=4096, intermediate_size=14336,
                   num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                   max_position_embeddings=32768, rope_theta=5e5)),
}


def random_target(shape: str, dtype=torch.bfloat16):
    """A random-weight `*ForCausalLM` of a named real shape on the GPU, in `dtype`, eval mode."""
    config_cls, sizes = SHAPES[shape]
    with torch.device("cuda"):
        return AutoModelForCausalLM.from_config(config_cls(**sizes, initializer_range=0.02), dtype=dtype).eval()


def plain_graph_timing(target, ids, new_tokens: int, plain) -> dict:
    """The plain loop (`plain_graph`) on the same prompt: warm-up (compile + capture) seconds, ms per token with the
    bench's clock, and whether its output equals `plain` (generate's); its cache and graph are freed on return."""
    loop = PlainGraphLoop(target)
    _, warm_up_s = timed_call(lambda: loop(ids, new_tokens), "cuda")
    _, t1 = timed_call(lambda: loop(ids, 1), "cuda")
    out, tn = timed_call(lambda: loop(ids, new_tokens), "cuda")
    return {"plain_graph_warm_up_s": warm_up_s,
            "plain_graph_ms_per_token": 1e3 * (tn - t1) / (out.shape[1] - ids.shape[1] - 1),
            "plain_graph_equals_plain": bool(torch.equal(out, plain))}


def profile(target, draft, context: int, new_tokens: int) -> dict:
    """Time plain greedy and LongSpec (eager / CUDA graphs / graphs + compile) at one context length (tokens)."""
    ids = torch.randint(100, 20000, (1, context), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    row = {"context": context, "new_tokens": new_tokens}
    _, t1 = timed_call(lambda: target.generate(ids, do_sample=False, max_new_tokens=1), "cuda")
    plain, tn = timed_call(lambda: target.generate(ids, do_sample=False, max_new_tokens=new_tokens), "cuda")
    row["plain_ms_per_token"] = 1e3 * (tn - t1) / (new_tokens - 1)
    row.update(plain_graph_timing(target, ids, new_tokens, plain))
    for name, static, compile in (("eager", False, False), ("graphs", True, False), ("compiled", True, True)):
        draft.free_static_buffers()
        torch.cuda.reset_peak_memory_stats()
        def longspec():
            return target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=new_tokens,
                                   longspec_static_shapes=static, longspec_compile=compile)

        first, t_first = timed_call(longspec, "cuda")
        out, t = timed_call(longspec, "cuda")
        s = draft.last_generation_stats
        steps = len(s.accepted_lengths)
        step_ms = 1e3 * (s.total_s - s.prefill_s) / steps
        row[name] = {
            "first_call_s": t_first, "call_s": t, "prefill_s": s.prefill_s, "steps": steps, "tau": s.tau,
            "ms_per_step": step_ms,
            "draft_ms_per_step": 1e3 * s.draft_s / steps, "verify_ms_per_step": 1e3 * s.verify_s / steps,
            "other_ms_per_step": step_ms - 1e3 * (s.draft_s + s.verify_s) / steps,
            "predicted_ratio_per_tau": row["plain_graph_ms_per_token"] / step_ms,
            "equals_plain": bool(torch.equal(out, plain)), "same_as_first_call": bool(torch.equal(out, first)),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        }
    return row


def timing_pattern(target, draft, context: int, new_tokens: int) -> dict:
    """Decode seconds of LongSpec as `longspec bench` measures them, T(N) - T(1), without and with an untimed
    full-length warm-up on the same prompt first (the warm-up captures the prompt's buckets, as static-cache
    baselines are compiled before timing)."""
    ids = torch.randint(100, 20000, (1, context), device="cuda", generator=torch.Generator("cuda").manual_seed(1))

    def call(n):
        return timed_call(lambda: target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=n),
                          "cuda")[1]

    row = {"context": context, "new_tokens": new_tokens}
    for name, warm in (("cold", False), ("warm", True)):
        draft.free_static_buffers()
        warm_s = call(new_tokens) if warm else None
        t1 = call(1)
        tn = call(new_tokens)
        row[name] = {"warm_up_s": warm_s, "decode_s": tn - t1,
                     "ms_per_step": 1e3 * (tn - t1) / len(draft.last_generation_stats.accepted_lengths)}
    return row


def step_table(rows: list[dict]) -> str:
    """Markdown: per context and LongSpec variant, draft / verify / other ms per step beside the plain loops' ms per
    token (`plain_graph`, HF `generate`) and τ × plain_graph ms / step ms for τ = 1."""
    head = ("| context | variant | draft ms | verify ms | other ms | step ms | plain_graph ms/token "
            "| generate ms/token | predicted × per τ |")
    lines = [head, "|" + "---|" * 9]
    for row in rows:
        for name in ("eager", "graphs", "compiled"):
            v = row[name]
            cells = [row["context"], name, *[f"{v[k]:.2f}" for k in ("draft_ms_per_step", "verify_ms_per_step",
                     "other_ms_per_step", "ms_per_step")], f"{row['plain_graph_ms_per_token']:.2f}",
                     f"{row['plain_ms_per_token']:.2f}", f"{v['predicted_ratio_per_tau']:.2f}"]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="qwen2.5-1.5b", choices=sorted(SHAPES))
    parser.add_argument("--contexts", default="8192,16384,30000")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--out", default="step_profile.json")
    parser.add_argument("--timing-pattern", action="store_true",
                        help="only compare bench timing without / with a same-prompt warm-up (timing_pattern)")
    args = parser.parse_args()
    target = random_target(args.shape)
    draft = LongSpecDraft.from_target(target).to(device="cuda", dtype=torch.bfloat16)
    rows = []
    for context in [int(c) for c in args.contexts.split(",")]:
        measure = timing_pattern if args.timing_pattern else profile
        rows.append(measure(target, draft, context, args.new_tokens))
        print(json.dumps(rows[-1]), flush=True)
    if not args.timing_pattern:
        print(step_table(rows))
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": args.shape}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
