"""The `longspec` command: --help a new user can follow; user mistakes give one line on stderr, exit status 2 and no
traceback, before any model loads. (`longspec train` end to end: tests/trainers/test_recipes_cli.py.)"""

import os
import re
import subprocess
import sys

import pytest
import torch

from transformers_longspec.cli import build_parser, main


@pytest.mark.parametrize("argv, expected", [
    ([], ["examples:", "A *target* is the model", "tau", "longspec COMMAND --help"]),
    (["demo"], ["--task", "bundled trained draft", "tau"]),
    (["generate"], ["--target MODEL", "--draft FOLDER", "--tree WIDTHS", "identical", "example:"]),
    (["train"], ["--recipe NAME_OR_JSON", "stage1", "LoRA", "example:"]),
])
def test_help_explains_each_command(argv, expected, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for phrase in expected:
        assert phrase in text, phrase


def test_python_dash_m_runs_the_longspec_command(monkeypatch):
    """`python -m transformers_longspec --help` (no console script on PATH needed) prints the `longspec` usage."""
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps help to the terminal width, here and in the subprocess
    done = subprocess.run([sys.executable, "-m", "transformers_longspec", "--help"], capture_output=True, text=True,
                          env=os.environ.copy(), timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == build_parser().format_help()


# (argv, expected message); {tmp} is replaced by a fresh temporary folder
MISTAKES = {
    "tree with a zero": (["generate", "--prompt", "hi", "--tree", "4,0"], "--tree takes comma-separated positive"),
    "tree not numbers": (["generate", "--prompt", "hi", "--tree", "4,x"], "--tree takes comma-separated positive"),
    # argparse alone reads "-1,4" as an option and says only "expected one argument"
    "tree with a negative width": (["generate", "--prompt", "hi", "--tree", "-1,4"],
                                   r"--tree takes comma-separated positive beam widths.*got '-1,4'"),
    "tree with an empty width": (["generate", "--prompt", "hi", "--tree", "4,,8"], "positive beam widths.*got '4,,8'"),
    "tree of commas only": (["generate", "--prompt", "hi", "--tree", ",,"], "or 'none' for no draft tree; got ',,'"),
    "bad dtype": (["generate", "--prompt", "hi", "--dtype", "float64"], "invalid choice: 'float64'"),
    "no prompt": (["generate", "--target", "{tmp}"], "give --prompt TEXT or --prompt-file PATH"),
    "missing prompt file": (["generate", "--prompt-file", "{tmp}/prompt.txt"], "prompt.txt': no such file"),
    "empty prompt file": (["generate", "--prompt-file", "{tmp}/empty.txt"], "empty.txt' is empty; put the prompt"),
    "prompt and prompt file": (["generate", "--prompt", "hi", "--prompt-file", "{tmp}/empty.txt"],
                               "--prompt-file: not allowed with argument --prompt"),
    "prompt file is a folder": (["generate", "--prompt-file", "{tmp}"], "is a folder; give the path of a text file"),
    "empty prompt": (["generate", "--prompt", " "], "--prompt is empty"),
    "bench missing target before data": (["bench", "--target", "{tmp}/model", "--data-dir", "{tmp}/none", "--out",
                                          "{tmp}/b"], "--target .*not a model folder"),
    "bench missing draft before data": (["bench", "--target", "{tmp}", "--draft", "{tmp}/draft", "--data-dir",
                                         "{tmp}/none", "--out", "{tmp}/b"], "--draft .*no folder"),
    "data bad --set-mix": (["data", "--recipe", "smollm2-mix", "--target", "smollm2", "--set-mix", "short_rows"],
                           "--set-mix expects KEY=VALUE \\(e.g. --set-mix short_rows="),
    "missing draft folder": (["generate", "--prompt", "hi", "--draft", "{tmp}/draft"], "--draft .*no folder"),
    "draft folder without config": (["generate", "--prompt", "hi", "--draft", "{tmp}"], "has no config.json"),
    "zero new tokens": (["generate", "--prompt", "hi", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    "zero tree nodes": (["generate", "--prompt", "hi", "--tree-nodes", "0"], "--tree-nodes must be >= 1"),
    "missing target": (["generate", "--prompt", "hi", "--target", "{tmp}/model"], "not a model folder, a .gguf"),
    "unknown command": (["serve"], "invalid choice: 'serve'"),
    # argparse reports a command's unknown option as the top-level program's ("longspec: error: ...")
    "bench unknown option": (["bench", "--target", "{tmp}", "--out", "{tmp}/b", "--bogus"],
                             r"^longspec bench: error: unrecognized arguments: --bogus \(see longspec bench --help\)"),
    "train unknown recipe": (["train", "--recipe", "no-such", "--target", "smollm2", "--output", "{tmp}/o"],
                             "no-such"),
    "train lora without draft": (["train", "--recipe", "stage1", "--target", "smollm2", "--output", "{tmp}/o",
                                  "--lora"], "--lora adapts a trained draft"),
    "train bad --set": (["train", "--recipe", "stage1", "--target", "smollm2", "--output", "{tmp}/o", "--set", "lr"],
                        "--set expects KEY=VALUE"),
    "train zero steps": (["train", "--recipe", "stage1", "--target", "smollm2", "--output", "{tmp}/o",
                          "--max-steps", "0"], "--max-steps must be >= 1"),
}
if not torch.cuda.is_available():
    MISTAKES["cuda without a GPU"] = (["generate", "--prompt", "hi", "--device", "cuda"], "no CUDA device")


@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_user_mistake_is_one_line_and_status_2(case, tmp_path, capsys):
    argv, message = MISTAKES[case]
    status = None
    (tmp_path / "empty.txt").write_text("\n")
    try:
        status = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    except SystemExit as exit_info:  # argparse's own usage errors
        status = exit_info.code
    err = capsys.readouterr().err
    assert status == 2
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("longspec") and re.search(message, err), err


def test_set_values_parse_json_and_python_booleans():
    """`--set KEY=VALUE`: JSON where it parses, Python's True / False as booleans (the string "False" is truthy)."""
    from transformers_longspec.cli.train import _parse_sets

    parsed = _parse_sets(["a=1e-4", "b=true", "c=False", "d=True", "e=[1, 2]", "f=cosine", "g=false"])
    assert parsed == {"a": 1e-4, "b": True, "c": False, "d": True, "e": [1, 2], "f": "cosine", "g": False}
    with pytest.raises(ValueError, match="--set expects KEY=VALUE"):
        _parse_sets(["novalue"])


@pytest.mark.parametrize("text, widths", [("4,16,16", [4, 16, 16]), (" 2, 4 ", [2, 4]), ("none", []), ("", []),
                                          ("None", []), (None, None)])
def test_tree_option_reads_widths_or_none(text, widths):
    from transformers_longspec.cli.generate import _parse_tree

    assert _parse_tree(text) == widths


def test_the_default_target_name_loads_its_tokenizer(smollm2):
    """`--target smollm2` for the tokenizer alone (`longspec data`): the bundled GGUF's, the model's own."""
    from transformers_longspec.cli.models import load_tokenizer

    _, tokenizer = smollm2
    loaded = load_tokenizer("smollm2")
    assert len(loaded) == len(tokenizer) == 49152
    text = "def add(a, b):\n    return a + b  # ünïcode"
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
