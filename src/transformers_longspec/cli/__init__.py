"""`longspec` command line: `demo`, `generate`, `train` / `data`, `bench` (a module per command, `models` shared).

    longspec demo                         # SmolLM2-135M-Instruct + our trained draft on a real repository file
    longspec generate --target smollm2 --prompt "Write a haiku about GPUs." --chat
    longspec train --help
    longspec bench --help                 # every decoding method side by side on real long prompts

`python -m transformers_longspec ...` (or `python -m transformers_longspec.cli ...`) is the same command. User
mistakes (bad paths, bad tree shapes, missing optional packages) print one line and exit with status 2, found before
any model loads where possible; Ctrl-C exits with status 130.
"""

from __future__ import annotations

import argparse
import re
import sys

from .bench import add_bench_parser
from .generate import add_demo_parser, add_generate_parser
from .train import add_data_parser, add_train_parser

__all__ = ["build_parser", "main"]

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
    """The `longspec` argument parser: `demo`, `generate`, `train`, `data`, `bench` (each with its own `--help`)."""
    parser = _Parser(
        prog="longspec", epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Lossless long-context speculative decoding (LongSpec) for Hugging Face transformers.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (add_demo_parser, add_generate_parser, add_train_parser, add_data_parser, add_bench_parser):
        add(sub)
    parser.commands = sub.choices  # command name -> its parser, for main's unknown-argument error
    return parser


def _join_negative_tree(argv: list[str]) -> list[str]:
    """`--tree -1,4` as `--tree=-1,4`: argparse takes a value starting with '-' (other than a plain negative
    number) for an option and reports only "expected one argument"; joined, the value reaches `--tree`'s own check,
    which says widths must be positive."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--tree" and re.match(r"-\d", arg):
            out[-1] = f"--tree={arg}"
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `longspec` command. Returns the exit status: 0, 2 for a user mistake (one line on stderr,
    no traceback), 130 when interrupted."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(_join_negative_tree(sys.argv[1:] if argv is None else list(argv)))
    if unknown:  # reported by the command's own parser: "longspec bench: error: ..." (see longspec bench --help)
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        args.func(args)
    except (ValueError, ImportError, OSError) as err:  # user mistakes: paths, files, options, missing packages
        print(f"longspec {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nlongspec {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0
