"""Where a cold first call's compile time goes (GPU; random weights of a real target's shape).

Session 23's bench on a fresh H100 spent 166 s in the first LongSpec call (tree [4,8,8,8] + 10) and 138 s more in
the first call with another tree shape, against ~20 s when the machine's inductor cache already held the regions.
This runs three calls with the compiled regions and CUDA graphs (the GPU default) on one prompt: a first shape, a
second shape, the first again; per call it writes the wall seconds, the graphs dynamo compiled and the cumulative
compile-time table of `torch._dynamo.utils.compile_times` (dynamo tracing, inductor, Triton), one JSON line each to
`$OUT/compile_profile.jsonl` (written as it goes: a call cut short keeps the earlier lines), then one warm call of
the first shape (128 new tokens: ms per step, draft and verification seconds per step).

    PYTHONPATH=src:benchmarks python benchmarks/compile_profile.py --context 8192
    PYTHONPATH=src:benchmarks python benchmarks/compile_profile.py --context 8192 --dynamic-regions
    PYTHONPATH=src:benchmarks python benchmarks/compile_profile.py --context 8192 --policy

`--policy` names no tree in the first call, so the tree policy chooses it (what a user's first call does): that
call's row adds the seconds of the policy's cost measurement (`tree_policy.measure_costs`: eager forwards and the
draft growing each ladder shape) and the tree it chose. Every row counts the files in the Triton cache
(`TRITON_CACHE_DIR`): kernels compiled so far.

`--draft PATH` loads a trained draft (a folder or compact file of this target shape, e.g. the committed Qwen draft)
onto the random target instead of an untrained draft built from it: its configuration (the target layers it reads,
its draft vocabulary, its MLP width) is what a user's first call compiles.

`--dynamic-regions` compiles the target's decoder layers with `dynamic=True` (an experiment, not the engine's
default): on the CPU (tiny Qwen2, session 23) a second and third tree shape then compile only the draft phase (one
graph, 2-3 s) instead of the layers' five graphs again (24-28 s); whether the dynamic-shape kernels keep the step's
speed under CUDA graphs is what this measures on the GPU.

Start it on a fresh machine (or with `TORCHINDUCTOR_CACHE_DIR` pointing at an empty folder): a warm cache measures
the cache, not the compiler.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from step_profile import SHAPES, random_target
from torch._dynamo.utils import compile_times, counters

from transformers_longspec import LongSpecDraft, static_step, tree_policy

MEASURE_S = []  # seconds of each `tree_policy.measure_costs` call (the policy's cost measurement)


def timed_measure_costs(*args, **kwargs):
    """`tree_policy.measure_costs`, its seconds appended to `MEASURE_S` (installed over it by `main`)."""
    start = time.perf_counter()
    costs = SHIPPED_MEASURE_COSTS(*args, **kwargs)
    MEASURE_S.append(time.perf_counter() - start)
    return costs


def triton_cache_files() -> int | None:
    """Files under `TRITON_CACHE_DIR` (None when it is not set): grows with every kernel Triton compiles."""
    root = os.environ.get("TRITON_CACHE_DIR")
    return sum(len(files) for _, _, files in os.walk(root)) if root else None


def timed_first_call(target, draft, ids, widths) -> dict:
    """One greedy call (16 new tokens) with `widths` (None: the policy chooses) and a 10-token retrieval branch:
    seconds, graphs compiled, and for a policy call its cost measurement's seconds and the chosen tree."""
    before, measured = counters["stats"]["unique_graphs"], len(MEASURE_S)
    torch.cuda.synchronize()
    start = time.perf_counter()
    target.generate(ids, assistant_model=draft, max_new_tokens=16, do_sample=False, longspec_beam_widths=widths,
                    longspec_retrieval=10)
    torch.cuda.synchronize()
    row = {"widths": widths, "call_s": round(time.perf_counter() - start, 2),
           "graphs_compiled": counters["stats"]["unique_graphs"] - before, "triton_cache_files": triton_cache_files()}
    if widths is None:
        row.update(chosen=list(draft.last_generation_stats.beam_widths),
                   measure_costs_s=round(sum(MEASURE_S[measured:]), 2))
    return {**row, "compile_times": compile_times(repr="str", aggregate=True)}


def warm_step(target, draft, ids, widths) -> dict:
    """A call of 128 new tokens with `widths` after its shape is compiled: ms per step after the prefill, and the
    engine's draft / verification ms per step (`LongSpecStats`)."""
    target.generate(ids, assistant_model=draft, max_new_tokens=128, do_sample=False, longspec_beam_widths=widths,
                    longspec_retrieval=10)
    stats = draft.last_generation_stats
    steps = len(stats.accepted_lengths)
    return {"warm_widths": widths, "steps": steps,
            "step_ms": round(1e3 * (stats.total_s - stats.prefill_s) / steps, 3),
            "draft_ms": round(1e3 * stats.draft_s / steps, 3), "verify_ms": round(1e3 * stats.verify_s / steps, 3)}


SHIPPED_REGIONS = static_step._compile_regions
SHIPPED_MEASURE_COSTS = tree_policy.measure_costs


def dynamic_regions(target) -> dict:
    """`static_step._compile_regions` (the same decoder-layer classes and methods) compiled with `dynamic=True`."""
    return {cls: (name, torch.compile(getattr(cls, name), dynamic=True))
            for cls, (name, _) in SHIPPED_REGIONS(target).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="qwen2.5-1.5b", choices=sorted(SHAPES))
    parser.add_argument("--context", type=int, default=8192, help="prompt tokens")
    parser.add_argument("--dynamic-regions", action="store_true", help="compile the decoder layers with dynamic=True")
    parser.add_argument("--policy", action="store_true", help="the first call names no tree: the policy chooses")
    parser.add_argument("--draft", help="a trained draft of this target shape (default: an untrained one from it)")
    args = parser.parse_args()
    if args.dynamic_regions:
        static_step._compile_regions = dynamic_regions
    tree_policy.measure_costs = timed_measure_costs
    target = random_target(args.shape)
    if args.draft:
        draft = LongSpecDraft.from_pretrained(args.draft, target_model=target)
    else:
        draft = LongSpecDraft.from_target(target, target_hidden_input=True).to(device="cuda", dtype=torch.bfloat16)
    torch.manual_seed(0)
    ids = torch.randint(100, 20000, (1, args.context), device="cuda")
    path = os.path.join(os.environ.get("OUT", "."), "compile_profile.jsonl")
    with open(path, "a") as log:
        def emit(row: dict) -> None:  # printed and kept as it goes: a run cut short keeps its earlier lines
            print(json.dumps(row), flush=True)
            log.write(json.dumps(row) + "\n")
            log.flush()

        emit({"dynamic_regions": args.dynamic_regions, "policy": args.policy, "draft": args.draft,
              "shape": args.shape, "context": args.context, "device": torch.cuda.get_device_name(),
              "torch": torch.__version__})
        first = None if args.policy else [4, 8, 8, 8]
        for widths in (first, [4, 16, 16, 16, 16], [4, 8, 8, 8]):
            emit(timed_first_call(target, draft, ids, widths))
        emit({**warm_step(target, draft, ids, [4, 8, 8, 8]), "dynamic_regions": args.dynamic_regions})


if __name__ == "__main__":
    main()
