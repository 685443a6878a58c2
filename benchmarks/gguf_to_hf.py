"""Convert a GGUF checkpoint once into a safetensors folder (model + tokenizer) that loads in seconds.

transformers de-quantises a GGUF file at every load (about 70 s for Qwen2.5-Coder-1.5B-Instruct on the H200
machine). This loads it once, writes the de-quantised weights in `--dtype` and the tokenizer (chat template
included) with `save_pretrained`, reloads the folder and checks that its logits on a short prompt equal the
GGUF-loaded model's (same weights, so they must be bit-identical). Any tool that takes a model folder reads it:
`longspec train --target FOLDER`, `benchmarks/eval_lossless.py --target FOLDER`.

    python benchmarks/gguf_to_hf.py ~/stage/qwen2.5-coder-1.5b-instruct.gguf ~/qwen15 --dtype bfloat16

Needs the `gguf` package for the load. Reference: transformers `from_pretrained(gguf_file=...)`, `save_pretrained`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
from transformers.utils import logging


def convert(gguf: Path, output: Path, dtype: torch.dtype, device: str) -> dict:
    """Load `gguf`, save model + tokenizer to `output`, reload and compare logits.

    Args:
        gguf: the .gguf file.
        output: folder to write (created; existing files are overwritten).
        dtype: weights dtype of the saved model (e.g. torch.bfloat16).
        device: where the logits check runs ("cuda" or "cpu").
    Returns: {"load_s", "save_s", "reload_s" (seconds), "parameters", "chat_template" (bool)}.
    Raises: FileNotFoundError if `gguf` is missing; RuntimeError if the reloaded logits differ.
    """
    if not gguf.is_file():
        raise FileNotFoundError(f"{gguf} is not a file (stage it first: gguf-models stage NAME)")
    logging.disable_progress_bar()  # one bar per de-quantised tensor otherwise
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # transformers (5.17 and later) keeps GGUF weights packed when it has a GGUF matmul kernel for the device, and a
    # packed model cannot be saved: ask for plain dense weights.
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=dtype, quantization_config=GgufConfig(dequantize=True)
    ).to(device).eval()
    loaded = time.perf_counter()
    model.save_pretrained(output)
    tokenizer.save_pretrained(output)
    saved = time.perf_counter()
    again = AutoModelForCausalLM.from_pretrained(output, dtype=dtype).to(device).eval()
    reloaded = time.perf_counter()
    ids = AutoTokenizer.from_pretrained(output)("def fibonacci(n):\n    ", return_tensors="pt").input_ids.to(device)
    with torch.no_grad():
        if not torch.equal(model(ids).logits, again(ids).logits):
            raise RuntimeError(f"{output}: the reloaded model's logits differ from the GGUF-loaded model's")
    return {"load_s": loaded - start, "save_s": saved - loaded, "reload_s": reloaded - saved,
            "parameters": sum(p.numel() for p in model.parameters()),
            "chat_template": getattr(tokenizer, "chat_template", None) is not None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("gguf", type=Path)
    p.add_argument("output", type=Path)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    report = convert(args.gguf.expanduser(), args.output.expanduser(), getattr(torch, args.dtype), args.device)
    print(f"gguf_to_hf: {args.gguf.name} -> {args.output} ({args.dtype}): "
          + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in report.items()), flush=True)


if __name__ == "__main__":
    main()
