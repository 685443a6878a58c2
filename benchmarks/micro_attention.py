"""Micro-benchmark: hybrid tree attention against the alternatives, and one verify step against one decode step.

Part 1, one attention call of `tree` queries over [context cache; tree] keys, per GQA shape × context × tree size:
  hybrid        `transformers_longspec.attention.hybrid_tree_attention`: unmasked flash over the cache with its LSE,
                the Triton tree kernel over the tree, exact LSE merge (the package's verification path)
  eager_mask    transformers' `eager_attention_forward` with a full additive mask over [cache; tree]
                (what a stock model in eager mode does with a custom 4D tree mask)
  flash_nomask  `scaled_dot_product_attention`, flash backend, same queries, no mask: a lower bound (same work,
                but wrong for a tree)
Each is timed with CUDA events around every call (median of --reps after --warmup calls; this includes host
launch overhead when it exceeds the GPU time) and, unless --no-graphs, replayed from a CUDA graph (GPU time only).
Errors: max |out − fp32 reference| of the masked attention (hybrid, eager_mask; also hybrid vs eager_mask) and of
the unmasked attention (flash_nomask).

Part 2, one step of a Llama-3-8B-shaped model (random weights, bf16; LlamaConfig: hidden 4096, 32 layers, 32/8
heads, intermediate 14336, vocab 128256, rope theta 500000) holding --step-context tokens:
  verify        `verification.verify_tree` over a random 64-node tree (hybrid tree attention, `LongSpecCache`)
  decode_static one-token forward, SDPA, `StaticCache`
  decode_dynamic one-token forward, SDPA, `DynamicCache` (concatenates the whole cache every step)
The verify/decode ratio is the cost of one verification in decode steps: LongSpec gains when τ exceeds it.

    python benchmarks/micro_attention.py --out results/             # H200: about 1-2 minutes
    python benchmarks/micro_attention.py --tiny --out /tmp/micro     # CPU smoke test (seconds)

Reference: LongSpec (arXiv 2502.17421) §3.4 (hybrid tree attention); transformers `eager_attention_forward`;
PyTorch `torch.nn.attention.sdpa_kernel`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig, StaticCache
from transformers.models.llama.modeling_llama import eager_attention_forward

from transformers_longspec import LongSpecCache, compat
from transformers_longspec.attention import hybrid_tree_attention
from transformers_longspec.bench.report import environment
from transformers_longspec.tree import DraftTree, tree_layout
from transformers_longspec.verification import verify_tree

# (query heads, kv heads, head_dim)
SHAPES = {"qwen2.5-1.5b": (12, 2, 128), "llama-3-8b": (32, 8, 128), "tiny": (4, 2, 16)}
LLAMA3_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                 intermediate_size=14336, vocab_size=128256, rope_parameters={"rope_type": "default",
                                                                              "rope_theta": 500000.0})
TINY_MODEL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=256, rope_parameters={"rope_type": "default", "rope_theta": 1e4})


@dataclass
class MicroArgs:
    """Options (see `--help`). Contexts and tree sizes in tokens."""

    device: str = "cuda"
    dtype: str = "bfloat16"
    shapes: list[str] = field(default_factory=lambda: ["qwen2.5-1.5b", "llama-3-8b"])
    contexts: list[int] = field(default_factory=lambda: [4096, 8192, 16384, 32768])
    trees: list[int] = field(default_factory=lambda: [16, 32, 64])
    warmup: int = 5
    reps: int = 20
    graphs: bool = True
    step_model: str = "llama-3-8b"
    step_context: int = 32768
    step_tree: list[int] = field(default_factory=lambda: [4, 12, 16, 16, 15])  # 1 + 63 = 64 nodes
    out: str = "."


def _time_us(fn, device: torch.device, warmup: int, reps: int) -> float:
    """Median microseconds of `fn()` over `reps` calls after `warmup` (CUDA events on a GPU, wall clock on CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def _graph_us(fn, device: torch.device, warmup: int, reps: int) -> float | str:
    """Median microseconds of replaying `fn` captured in a CUDA graph; the error text if capture fails."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError as err:
        return f"capture failed: {str(err).splitlines()[0][:200]}"
    return _time_us(graph.replay, device, warmup, reps)


def _tree_mask(size: int, generator: torch.Generator) -> torch.Tensor:
    """(size, size) bool ancestor-or-self mask of a random tree (node i's parent drawn from nodes < i)."""
    mask = torch.eye(size, dtype=torch.bool)
    for i in range(1, size):
        mask[i] |= mask[int(torch.randint(0, i, (1,), generator=generator))]
    return mask


def attention_case(shape: str, context: int, tree: int, args: MicroArgs) -> dict:
    """Time and check the three attention paths for one shape (see the module docstring); returns one row."""
    heads, kv_heads, dim = SHAPES[shape]
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(context + tree)
    q = torch.randn(1, heads, tree, dim, generator=g).to(device, dtype)
    k, v = (torch.randn(1, kv_heads, context + tree, dim, generator=g).to(device, dtype) for _ in range(2))
    ancestors = _tree_mask(tree, g).to(device)
    visible = torch.cat([torch.ones(tree, context, dtype=torch.bool, device=device), ancestors], dim=1)
    scale = dim**-0.5
    module = SimpleNamespace(num_key_value_groups=heads // kv_heads, training=False)

    def additive(dt):
        return torch.zeros(1, 1, tree, context + tree, dtype=dt, device=device).masked_fill(
            ~visible, torch.finfo(dt).min)

    mask = additive(dtype)
    native = _flash_gqa_native(q, k, v, scale)
    paths = {
        "hybrid": lambda: hybrid_tree_attention(q, k, v, ancestors, scale).transpose(1, 2),
        "eager_mask": lambda: eager_attention_forward(module, q, k, v, mask, scale)[0],
        "flash_nomask": lambda: _flash(q, k, v, scale, native).transpose(1, 2),
    }
    qf, kf, vf = q.float(), k.float(), v.float()
    masked_ref = eager_attention_forward(module, qf, kf, vf, additive(torch.float32), scale)[0]
    open_ref = eager_attention_forward(module, qf, kf, vf, None, scale)[0]
    outs = {name: fn().float() for name, fn in paths.items()}
    row = {"shape": shape, "context": context, "tree": tree, "flash_gqa": "native" if native else "kv repeated",
           "err_hybrid": (outs["hybrid"] - masked_ref).abs().max().item(),
           "err_eager_mask": (outs["eager_mask"] - masked_ref).abs().max().item(),
           "hybrid_vs_eager_mask": (outs["hybrid"] - outs["eager_mask"]).abs().max().item(),
           "err_flash_nomask": (outs["flash_nomask"] - open_ref).abs().max().item()}
    for name, fn in paths.items():
        row[f"{name}_us"] = _time_us(fn, device, args.warmup, args.reps)
        if args.graphs and device.type == "cuda":
            row[f"{name}_graph_us"] = _graph_us(fn, device, args.warmup, args.reps)
    return row


def _flash(q, k, v, scale, native_gqa: bool = True):
    """Unmasked SDPA restricted to the flash backend; GQA through enable_gqa, or K/V repeated per query head."""
    if not native_gqa:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=native_gqa)


def _flash_gqa_native(q, k, v, scale) -> bool:
    """Whether this torch build's flash backend takes GQA (enable_gqa) for these tensors."""
    try:
        _flash(q, k, v, scale)
    except RuntimeError:
        return False
    return True


def _random_tree(beam_widths, vocab: int, device) -> DraftTree:
    """A `DraftTree` of random tokens: each depth's nodes hang off random nodes of the previous depth."""
    depths, ranges = tree_layout(beam_widths)
    g = torch.Generator().manual_seed(0)
    size = depths.numel()
    parents = torch.full((size,), -1, dtype=torch.long)
    ancestors = torch.eye(size, dtype=torch.bool)
    for (ps, pe), (s, e) in zip(ranges[:-1], ranges[1:]):
        parents[s:e] = torch.randint(ps, pe, (e - s,), generator=g)
        ancestors[s:e] |= ancestors[parents[s:e]]
    tokens = torch.randint(0, vocab, (size,), generator=g)
    return DraftTree(tokens.to(device), parents.to(device), depths.to(device), ancestors.to(device),
                     torch.zeros(size, device=device))


def _filled(model, cache, ids: torch.Tensor):
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return cache


def _verify_us(model, ids: torch.Tensor, tree: DraftTree, args: MicroArgs) -> float:
    """Median µs of `verify_tree` over a `LongSpecCache` holding `ids`, the tree cropped off after every call."""
    cache = _filled(model, LongSpecCache(model.config.num_hidden_layers, ids.shape[1] + tree.size), ids)

    def verify():
        verify_tree(model, tree, cache)
        cache.crop(-tree.size)

    with torch.no_grad(), compat.tree_attention(model):
        return _time_us(verify, ids.device, args.warmup, args.reps)


def _decode_us(model, cache, ids: torch.Tensor, args: MicroArgs) -> float:
    """Median µs of a one-token forward after filling `cache` with `ids` (the cache grows by one per call)."""
    _filled(model, cache, ids)
    token = ids[:, -1:]
    with torch.no_grad():
        return _time_us(lambda: model(input_ids=token, past_key_values=cache, use_cache=True), ids.device,
                        args.warmup, args.reps)


def step_case(args: MicroArgs) -> dict:
    """Verify step (64-node tree, hybrid attention) vs one-token decode steps, same random model and context."""
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    sizes = LLAMA3_8B if args.step_model == "llama-3-8b" else TINY_MODEL
    config = LlamaConfig(**sizes, max_position_embeddings=args.step_context + 4096)
    t0 = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    row = {"model": args.step_model, "context": args.step_context, "build_s": time.perf_counter() - t0}
    ids = torch.randint(0, config.vocab_size, (1, args.step_context), device=device)
    tree = _random_tree(args.step_tree, config.vocab_size, device)
    row["tree"] = tree.size
    row["verify_us"] = _verify_us(model, ids, tree, args)
    steps = args.warmup + args.reps + 8
    row["decode_static_us"] = _decode_us(model, StaticCache(config=config, max_cache_len=ids.shape[1] + steps), ids,
                                         args)
    row["decode_dynamic_us"] = _decode_us(model, DynamicCache(config=config), ids, args)
    row["verify_in_static_decode_steps"] = row["verify_us"] / row["decode_static_us"]
    return row


def _markdown(rows: list[dict]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        cells = [f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]) for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _parse(argv=None) -> MicroArgs:
    d = MicroArgs()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=d.dtype, choices=["bfloat16", "float16", "float32"])
    p.add_argument("--shapes", type=lambda s: s.split(","), default=d.shapes, help=f"from {', '.join(SHAPES)}")
    p.add_argument("--contexts", type=_ints, default=d.contexts, help="cache lengths (tokens)")
    p.add_argument("--trees", type=_ints, default=d.trees, help="tree sizes (tokens)")
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--reps", type=int, default=d.reps)
    p.add_argument("--no-graphs", dest="graphs", action="store_false", help="skip CUDA-graph replay timings")
    p.add_argument("--step-model", default=d.step_model, choices=["llama-3-8b", "tiny"])
    p.add_argument("--step-context", type=int, default=d.step_context, help="0 skips part 2")
    p.add_argument("--step-tree", type=_ints, default=d.step_tree, help="beam widths per depth of the verify tree")
    p.add_argument("--tiny", action="store_true", help="CPU smoke sizes: tiny shapes, short contexts, fp32")
    p.add_argument("--out", default=d.out, help="folder for micro_attention.json")
    args = vars(p.parse_args(argv))
    if args.pop("tiny"):
        args.update(device="cpu", dtype="float32", shapes=["tiny"], contexts=[32, 96], trees=[4, 8], warmup=1,
                    reps=3, step_model="tiny", step_context=64, step_tree=[2, 2])
    return MicroArgs(**args)


def main(argv=None) -> dict:
    """Run both parts, print markdown tables, write `micro_attention.json`; returns the report."""
    args = _parse(argv)
    attention = [attention_case(s, c, t, args) for s in args.shapes for c in args.contexts for t in args.trees]
    print(_markdown(attention))
    step = step_case(args) if args.step_context > 0 else None
    if step is not None:
        print("\n" + _markdown([step]))
    report = {"meta": {**environment(), "args": asdict(args)}, "attention": attention, "step": step}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "micro_attention.json").write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
