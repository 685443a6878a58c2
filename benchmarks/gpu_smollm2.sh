#!/usr/bin/env bash
# One GPU lease for SmolLM2-135M-Instruct (staged at ~/stage/smollm2-135m-instruct.gguf by gguf-models):
#   bash benchmarks/gpu_smollm2.sh train        # train the draft (recipe smollm2-gpu) into $OUT/draft
#   bash benchmarks/gpu_smollm2.sh eval DTYPE   # lossless check + tau on real documents, plain vs LongSpec
# The package is not pip-installed there (no network): it is assembled under /tmp/pkg from the work tree.
set -euo pipefail
bash benchmarks/assemble_package.sh /tmp/pkg
export PYTHONPATH=/tmp/pkg:$HOME/stage/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true LONGSPEC_EVAL_DIR=$PWD/.evaldata
TARGET=$HOME/stage/smollm2-135m-instruct.gguf
DRAFT=${DRAFT:-$HOME/draft-smollm2}
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
case "$1" in
  train)
    python3 -m transformers_longspec.cli train --recipe smollm2-gpu --target "$TARGET" --output "$DRAFT" --save-dtype bf16 2>&1 \
      | grep -v "it/s\]$" | tee "$OUT/train.log"
    cp "$DRAFT"/config.json "$DRAFT"/model.safetensors "$DRAFT"/longspec_training.json "$OUT"/ ;;
  eval)
    python3 benchmarks/eval_lossless.py --target "$TARGET" --draft "$DRAFT" --dtype "$2" \
      --datasets summarization,code_completion --buckets 2048,4096,8192 --per-bucket 2 --max-context 7000 \
      --max-new-tokens "${NEW:-128}" --out "$OUT/eval_smollm2_$2.json" 2>&1 | tee "$OUT/eval_$2.log" ;;
esac
