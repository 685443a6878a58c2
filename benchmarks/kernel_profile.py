"""Which GPU kernels make up a LongSpec step, and what the draft's own vocabulary saves (GPU; random weights).

    python benchmarks/kernel_profile.py --contexts 8192,30000 --out kernel_profile.json

On a random-weight target of Qwen2.5-1.5B's shape with an untrained draft that reads the target's hidden state
(τ ≈ 1, so the numbers are per STEP), tree [4,16,16,16,16] + a retrieval branch of 10:
1. ms per step as users run it (CUDA graphs + compiled regions), with the draft's own vocabulary of 32,768 tokens
   (`vocabulary.py`) and with its 16,384 most frequent (`--vocab-sizes`; 0 = the whole vocabulary), beside the plain
   CUDA-graph loop's ms per token; `--intermediate-size` narrows the draft's MLP; the first vocabulary again with
   the attention kernel's GQA packing switched (`attention.PACK_GQA`: one program per kv head's query heads), and
   with the draft's beam selection in torch (log-softmax + two top-k) instead of the `beam_select` kernels;
2. the kernels of each phase (draft / verification / greedy acceptance) from `torch.profiler`, with the same static
   step run without graphs (the same kernels a graph replays, launched one by one): count, summed GPU time and the
   heaviest kernels. Summed kernel time vs the graphed phase time shows what is kernel work and what is the gaps
   between kernels.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json

import torch
from step_profile import random_target

from transformers_longspec import LongSpecDraft, attention, static_step, tree
from transformers_longspec import generation as generation_module
from transformers_longspec.bench import PlainGraphLoop, timed_call

WIDTHS, RETRIEVAL, VOCAB = [4, 16, 16, 16, 16], 10, 32768  # VOCAB: the draft's own vocabulary (frequent tokens)


def plain_graph_ms(target, ids, new_tokens: int) -> float:
    """ms per token of the plain CUDA-graph loop (`plain_graph`), warmed up on the same prompt."""
    loop = PlainGraphLoop(target)
    timed_call(lambda: loop(ids, new_tokens), "cuda")
    _, t1 = timed_call(lambda: loop(ids, 1), "cuda")
    _, tn = timed_call(lambda: loop(ids, new_tokens), "cuda")
    return 1e3 * (tn - t1) / (new_tokens - 1)


def step_ms(target, draft, ids, new_tokens: int, vocab: int) -> dict:
    """ms per step (draft / verification / other) of the second of two calls, graphs + compiled regions."""
    def call():
        return target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=new_tokens,
                               longspec_beam_widths=WIDTHS, longspec_retrieval=RETRIEVAL,
                               longspec_draft_vocab=vocab or False)

    _, first_s = timed_call(call, "cuda")
    timed_call(call, "cuda")
    s = draft.last_generation_stats
    steps = len(s.accepted_lengths)
    total = 1e3 * (s.total_s - s.prefill_s) / steps
    return {"first_call_s": first_s, "tau": s.tau, "step_ms": total, "draft_ms": 1e3 * s.draft_s / steps,
            "verify_ms": 1e3 * s.verify_s / steps, "other_ms": total - 1e3 * (s.draft_s + s.verify_s) / steps,
            "draft_vocab_tokens": s.draft_vocab_tokens}


def kernel_table(target, draft, ids, new_tokens: int, vocab: int, top: int = 12) -> dict:
    """Per phase: kernels per step, summed GPU ms per step and the `top` kernels by time, from one profiled call of
    the static step run without graphs (annotated phases: draft, verify, accept)."""
    engine_cls, phases = static_step.StaticTreeStep, {"_draft": "draft", "_verify": "verify",
                                                      "_accept_greedy": "accept"}
    originals = {name: getattr(engine_cls, name) for name in phases}

    def annotated(name):
        def run(self, *args, **kwargs):
            with torch.profiler.record_function(f"phase:{phases[name]}"):
                return originals[name](self, *args, **kwargs)
        return run

    def without_graphs(target, draft, widths, retrieval_tokens, capacity, compile, draft_vocab=0):
        return engine_cls(target, draft, widths, capacity, cuda_graphs=False, compile=compile,
                          retrieval_tokens=retrieval_tokens, draft_vocab=draft_vocab)

    real_engine = generation_module._static_engine
    try:
        generation_module._static_engine = without_graphs
        for name in phases:
            setattr(engine_cls, name, annotated(name))

        def call():
            return target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=new_tokens,
                                   longspec_beam_widths=WIDTHS, longspec_retrieval=RETRIEVAL,
                                   longspec_draft_vocab=vocab or False, longspec_compile=True,
                                   longspec_static_shapes=True)

        call()  # compiled regions warm
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            call()
        steps = len(draft.last_generation_stats.accepted_lengths)
    finally:
        generation_module._static_engine = real_engine
        for name, fn in originals.items():
            setattr(engine_cls, name, fn)
    return _by_phase(prof, steps, top)


def _by_phase(prof, steps: int, top: int) -> dict:
    """Assign each GPU kernel to the annotated phase whose range contains it: the ranges on the GPU timeline, or
    where the profiler recorded none, the CPU ranges and the kernels launched by CPU ops inside them."""
    cuda, events = torch.autograd.DeviceType.CUDA, prof.events()
    gpu_ranges = [(e.name.split(":", 1)[1], e.time_range) for e in events
                  if e.name.startswith("phase:") and e.device_type == cuda]
    if gpu_ranges:
        found = [(k.name, k.time_range.elapsed_us(), (k.time_range.start + k.time_range.end) / 2) for k in events
                 if k.device_type == cuda and not k.is_user_annotation]
        ranges = gpu_ranges
    else:  # CPU side: kernels hang off the CPU op that launched them
        ranges = [(e.name.split(":", 1)[1], e.time_range) for e in events
                  if e.name.startswith("phase:") and e.device_type != cuda]
        found = [(k.name, k.duration, e.time_range.start) for e in events if e.device_type != cuda
                 for k in e.kernels]
    out = {"ranges_on": "gpu" if gpu_ranges else "cpu"}
    for phase in ("draft", "verify", "accept"):
        spans = [(r.start, r.end) for name, r in ranges if name == phase]
        per_name, count, total = collections.Counter(), 0, 0.0
        for name, us, at in found:
            if any(s <= at <= e for s, e in spans):
                per_name[name[:90]] += us
                count, total = count + 1, total + us
        out[phase] = {"kernels_per_step": count / steps, "kernel_ms_per_step": total / 1e3 / steps,
                      "top_us_per_step": [(n, round(t / steps, 1)) for n, t in per_name.most_common(top)]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contexts", default="8192,30000")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--vocab-sizes", default=f"{VOCAB},16384",
                        help="draft vocabularies to time (frequent tokens; 0 = the whole vocabulary); the first is "
                             "profiled kernel by kernel")
    parser.add_argument("--intermediate-size", type=int, default=None, help="the draft MLP's width (default: the "
                        "target's)")
    parser.add_argument("--out", default="kernel_profile.json")
    args = parser.parse_args()
    sizes = [int(v) for v in args.vocab_sizes.split(",")]
    target = random_target("qwen2.5-1.5b")
    narrow = {} if args.intermediate_size is None else {"intermediate_size": args.intermediate_size}
    draft = LongSpecDraft.from_target(target, target_hidden_input=True, **narrow).to(device="cuda",
                                                                                       dtype=torch.bfloat16)
    draft.set_draft_vocabulary(torch.randperm(target.config.vocab_size, generator=torch.Generator().manual_seed(0))
                               [:VOCAB])
    rows = []
    for context in [int(c) for c in args.contexts.split(",")]:
        ids = torch.randint(100, 20000, (1, context), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
        row = {"context": context, "plain_graph_ms_per_token": plain_graph_ms(target, ids, args.new_tokens)}
        print(f"context {context}: plain_graph {row['plain_graph_ms_per_token']:.3f} ms/token", flush=True)
        for vocab in sizes:
            row[f"vocab_{vocab}"] = step_ms(target, draft, ids, args.new_tokens, vocab)
            print(f"vocab_{vocab}: {json.dumps(row[f'vocab_{vocab}'])}", flush=True)  # before the kernel table
        draft.free_static_buffers()  # graphs captured with the other kernel variant
        attention.PACK_GQA = not attention.PACK_GQA
        name = f"vocab_{sizes[0]}_pack_gqa_{attention.PACK_GQA}"
        row[name] = step_ms(target, draft, ids, args.new_tokens, sizes[0])
        print(f"{name}: {json.dumps(row[name])}", flush=True)
        attention.PACK_GQA = not attention.PACK_GQA
        draft.free_static_buffers()
        tree.beam_select = functools.partial(tree.beam_select, kernel=False)
        row[f"vocab_{sizes[0]}_torch_beam_select"] = step_ms(target, draft, ids, args.new_tokens, sizes[0])
        print(f"torch beam select: {json.dumps(row[f'vocab_{sizes[0]}_torch_beam_select'])}", flush=True)
        tree.beam_select = tree.beam_select.func
        draft.free_static_buffers()
        row["kernels"] = kernel_table(target, draft, ids, 32, vocab=sizes[0])
        draft.free_static_buffers()
        rows.append(row)
        print(json.dumps(row), flush=True)
    for row in rows:
        print(f"\n## context {row['context']}: plain_graph {row['plain_graph_ms_per_token']:.2f} ms/token")
        for name in [k for k in row if k.startswith("vocab_")]:
            v = row[name]
            print(f"{name}: step {v['step_ms']:.2f} ms = draft {v['draft_ms']:.2f} + verify {v['verify_ms']:.2f} + "
                  f"other {v['other_ms']:.2f} (first call {v['first_call_s']:.1f} s)")
        for phase, v in row["kernels"].items():
            if phase == "ranges_on":
                continue
            print(f"{phase}: {v['kernels_per_step']:.0f} kernels, {v['kernel_ms_per_step']:.2f} ms of kernels/step")
            for name, us in v["top_us_per_step"]:
                print(f"    {us:8.1f} us  {name}")
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "widths": WIDTHS,
            "retrieval": RETRIEVAL, "draft_vocab": VOCAB, "vocab_sizes": sizes,
            "pack_gqa_default": attention.PACK_GQA,
            "intermediate_size": draft.config.intermediate_size}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
