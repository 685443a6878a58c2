"""The draft's memory against context length: its weights, its ring cache and the peak of one tree growth.

    python benchmarks/draft_memory.py --target ~/qwen15 --draft ~/draft-qwen15 --contexts 2048,4096,8192,16384,30000

For each context (the last tokens of the evaluation set's first 30k-token code prompt) the target is prefilled into a
`LongSpecCache`, then one draft tree is grown eagerly (the ring filled from the prompt, every level's draft forward
with its cross-attention over the whole target cache). Reported per context, in bytes: the draft's parameters, its
ring cache (`DraftRingCache.nbytes`) and the peak of the GPU memory allocated during the tree growth above what was
allocated before it (activations, logits, the tree). The target's cache, which the draft reads but does not own, is
reported beside for scale. LongSpec §3.1: only the target cache should grow with the context.
"""

from __future__ import annotations

import argparse
import json

import torch

from transformers_longspec import LongSpecCache, LongSpecCandidateGenerator, LongSpecDraft
from transformers_longspec.bench import default_eval_dir, load_prompts
from transformers_longspec.cli.models import load_target


def measure(target, draft, ids: torch.Tensor) -> dict:
    """Bytes of the draft at one prompt `ids` (1, context) int64 on the target's device."""
    cuda = ids.is_cuda
    cache = LongSpecCache(target.config.num_hidden_layers, ids.shape[1] + 128)
    with torch.no_grad():
        target(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        generator = LongSpecCandidateGenerator(draft, cache, tuple(draft.config.beam_widths))
        if cuda:
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        tree = generator.draft_tree(torch.cat([ids, ids[:, -1:]], dim=1))
        peak = torch.cuda.max_memory_allocated() - before if cuda else None
    return {
        "context": ids.shape[1], "tree_size": tree.size,
        "draft_parameter_bytes": sum(p.numel() * p.element_size() for p in draft.parameters()),
        "ring_cache_bytes": generator.ring.nbytes(), "tree_growth_peak_bytes": peak,
        "target_cache_bytes": cache.storage.tensor.numel() * cache.storage.tensor.element_size(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, help="HF folder or .gguf of the target")
    parser.add_argument("--draft", help="trained draft folder (default: a new untrained draft; same shapes)")
    parser.add_argument("--contexts", default="2048,4096,8192,16384,30000", help="tokens, comma-separated")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default="draft_memory.json")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    target, tokenizer = load_target(args.target, getattr(torch, args.dtype), device)
    draft = (LongSpecDraft.from_pretrained(args.draft, target_model=target) if args.draft
             else LongSpecDraft.from_target(target)).to(device=device, dtype=target.dtype)
    contexts = [int(c) for c in args.contexts.split(",")]
    longest = load_prompts(tokenizer, ["code_completion"], [30000], 1, default_eval_dir(), device=device)[0]
    rows = []
    for context in contexts:
        rows.append(measure(target, draft, longest.ids[:, -context:]))
        print(json.dumps(rows[-1]), flush=True)
    meta = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
            "target": args.target, "draft": args.draft, "dtype": args.dtype, "prompt": longest.id}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
