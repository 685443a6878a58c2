#!/usr/bin/env bash
# GPU lease runs of the benchmark harness; Qwen2.5-Coder-1.5B-Instruct target and 0.5B assistant staged at
# ~/stage/*.gguf by gguf-models (README.md in this folder has the commands, run times and what each number means):
#   bash benchmarks/gpu_bench.sh micro     # micro_attention.py: attention paths, verify step vs decode step (~2 min)
#   bash benchmarks/gpu_bench.sh greedy    # longspec bench, every greedy method, exactness vs sdpa (~8 min)
#   bash benchmarks/gpu_bench.sh sample    # longspec bench, sampling at T = 1.0 and 0.7 (~6 min)
# The first greedy/sample run converts the GGUFs to bf16 HF folders (~2 min, once per machine) so that later runs
# load in seconds. Overrides: DRAFT (LongSpec draft folder; none = untrained draft, tau ~ 1), NEW (new tokens, 128),
# DATASETS, BUCKETS, PER_BUCKET, MAX_S (start no new prompt after this many seconds), LONGSPEC_COMMIT (for the JSON).
# The package is not pip-installed there (no network): it is assembled under /tmp/pkg from the work tree.
set -euo pipefail
mkdir -p /tmp/pkg && rm -rf /tmp/pkg/transformers_longspec
cp -r src/transformers_longspec /tmp/pkg/ && cp -r kernels trainers /tmp/pkg/transformers_longspec/
export PYTHONPATH=/tmp/pkg:$HOME/stage/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true LONGSPEC_EVAL_DIR=$PWD/.evaldata
TARGET=$HOME/stage/qwen2.5-coder-1.5b-instruct
ASSISTANT=$HOME/stage/qwen2.5-coder-0.5b-instruct
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader

to_hf() {  # de-quantise a staged GGUF once into a bf16 HF folder beside it
  [ -f "$1/config.json" ] && return
  python3 -c "import sys, torch; from transformers_longspec.cli_train import load_target
m, t = load_target(sys.argv[1] + '.gguf', torch.bfloat16); m.save_pretrained(sys.argv[1]); t.save_pretrained(sys.argv[1])" "$1"
}

bench() {
  to_hf "$TARGET"
  [ -f "$ASSISTANT.gguf" ] && to_hf "$ASSISTANT"
  python3 -m transformers_longspec.cli bench --target "$TARGET" ${DRAFT:+--draft "$DRAFT"} \
    $([ -f "$ASSISTANT/config.json" ] && echo --assistant "$ASSISTANT") --dtype bf16 --max-new-tokens "${NEW:-128}" \
    --per-bucket "${PER_BUCKET:-1}" --max-seconds "${MAX_S:-360}" --out "$OUT" "$@" 2>&1 | grep -v "it/s\]$" \
    | tee "$OUT/bench.log"
}

case "$1" in
  micro)
    python3 benchmarks/micro_attention.py --out "$OUT" 2>&1 | tee "$OUT/micro.log" ;;
  greedy)
    bench --methods sdpa,eager,static_compile,assisted,prompt_lookup,longspec \
      --datasets "${DATASETS:-code_completion,summarization}" --buckets "${BUCKETS:-8192,16384,30000}" ;;
  sample)
    bench --methods sdpa,longspec,sample,longspec_sample --temperatures 1.0,0.7 \
      --datasets "${DATASETS:-code_completion,math_reasoning}" --buckets "${BUCKETS:-8192,30000}" ;;
  *)
    echo "usage: bash benchmarks/gpu_bench.sh micro|greedy|sample" >&2; exit 2 ;;
esac
