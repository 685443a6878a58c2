"""The models a `longspec` command names: the target (`--target`), the draft (`--draft`) and their checks.

Shared by `demo`, `generate`, `train` and `bench`; loading is lazy (transformers' model classes import here, on use).

Reference: transformers `AutoModelForCausalLM.from_pretrained` (`gguf_file=`); `LongSpecDraft.from_pretrained`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from ..configuration import LongSpecConfig, size_mismatches

__all__ = ["check_draft_option", "check_target_option", "load_draft", "load_target", "load_tokenizer"]


def load_target(spec: str, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """Load the target model and tokenizer named on the command line.

    Args:
        spec: an HF model folder, a `.gguf` file (needs the `gguf` package), or "smollm2".
        dtype: weights dtype.
        device: "cpu" or "cuda".
    Returns: (model in eval mode, tokenizer).
    Raises: FileNotFoundError if the path does not exist; ImportError naming the package to install.
    Reference: transformers `AutoModelForCausalLM.from_pretrained` (`gguf_file=`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if spec == "smollm2":
        from ..demo import load_smollm2

        return load_smollm2(dtype=dtype, device=device)
    folder, gguf_file = _model_location(spec)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=dtype)
    return model.to(device).eval(), tokenizer


def load_tokenizer(spec: str):
    """The tokenizer of the target named on the command line (as `load_target`, without loading weights).

    Raises: FileNotFoundError if the path does not exist; ImportError naming the package to install.
    Reference: transformers `AutoTokenizer.from_pretrained` (`gguf_file=`).
    """
    from transformers import AutoTokenizer

    if spec == "smollm2":
        from ..demo import SMOLLM2_GGUF, smollm2_dir

        folder, gguf_file = Path(smollm2_dir()), SMOLLM2_GGUF
    else:
        folder, gguf_file = _model_location(spec)
    return AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)


def _model_location(spec: str) -> tuple[Path, str | None]:
    """(folder, GGUF file name or None) of a `--target` path: a `.gguf` file or a model folder."""
    path = Path(spec)
    if path.suffix == ".gguf" and path.is_file():
        return path.parent, path.name
    if path.is_dir():
        return path, None
    raise FileNotFoundError(f"--target {spec!r}: not a model folder, a .gguf file, or 'smollm2'")


def check_target_option(spec: str) -> None:
    """Raise FileNotFoundError naming `--target` unless `spec` is "smollm2", a `.gguf` file or a folder, as
    `load_target` takes them (cheap: no load)."""
    if spec != "smollm2":
        _model_location(spec)


def check_draft_option(path: str) -> None:
    """Raise ValueError naming `--draft` unless `path` is a saved LongSpec draft folder, a compact draft file
    (`save_compact`) or a Hub id (cheap: no load).

    Raises: ValueError (a missing path, another file, a folder without a LongSpec config.json).
    """
    from ..checkpoint import compact_file_config, local_draft_folder, read_draft_config

    try:
        if compact_file_config(path) is not None:
            return
        folder = local_draft_folder(path)
        if folder is not None:
            read_draft_config(folder)
    except ValueError as err:
        raise ValueError(f"--draft {path!r}: {err}") from None


def _bundled_draft_fits(target) -> bool:
    from ..demo import DEFAULT_DRAFT_DIR

    if not (DEFAULT_DRAFT_DIR / "config.json").exists():
        return False
    bundled, text = LongSpecConfig.from_pretrained(DEFAULT_DRAFT_DIR), target.config.get_text_config()
    return not size_mismatches(bundled, text) and bundled.target_num_hidden_layers == text.num_hidden_layers


def load_draft(path: str | None, target):
    """The draft at `path`, else the bundled SmolLM2 draft for the default target, else a new untrained one."""
    from ..demo import DEFAULT_DRAFT_DIR
    from ..modeling import LongSpecDraft

    if path is None and _bundled_draft_fits(target):
        path = str(DEFAULT_DRAFT_DIR)
    if path is None:
        print("note: no trained draft given; using an untrained one (tau will be near 1)", file=sys.stderr)
        return LongSpecDraft.from_target(target)
    return LongSpecDraft.from_pretrained(path, target_model=target)
