#!/usr/bin/env bash
# One GPU lease for Qwen2.5-Coder-1.5B-Instruct (issue 3 acceptance). Subcommands run in the order given, e.g.
#   bash benchmarks/gpu_qwen.sh prepare train   # GGUF -> bf16 folders, then the main draft   (about 6.5 min)
#   bash benchmarks/gpu_qwen.sh tau plots       # lossless check + tau 2k..30k, PNG + markdown  (about 4 min)
#   bash benchmarks/gpu_qwen.sh ablate plots    # 3 ablation drafts + their tau at 16k / 30k    (about 6 min)
#
#   prepare      ~/stage/qwen2.5-coder-1.5b-instruct.gguf -> ~/qwen15 (bf16 safetensors + tokenizer), and the 0.5B
#                GGUF -> ~/qwen05 when it is staged; de-quantising costs ~70 s per load, the folders load in seconds
#   train        recipe $TRAIN_RECIPE, default qwen2.5-coder-1.5b-gpu (1200 steps x 16 x 1024 tokens, ~4.4 min of
#                steps; qwen2.5-coder-1.5b-distill: self-distillation, 1600 steps) -> ~/draft-qwen15
#   ablate       = ablate-train + ablate-tau
#   ablate-train recipe qwen2.5-coder-1.5b-ablation (200 steps) three times, one switch changed: full,
#                noanchor (--set anchor_offset=false), nonoisy (--set noisy_training=false) -> ~/ablate-<variant>
#   ablate-tau   tau of the three ablation drafts at 16k and 30k tokens (one plain greedy run shared per prompt)
#   tau          lossless check + tau of ~/draft-qwen15 per bucket 2k..30k on code_completion and summarization
#   plots        loss curves (PNG) + tau tables (markdown) from everything in $RES so far (benchmarks/plot_training.py)
#
# Everything prints to $OUT/gpu_qwen.log. Results JSON are kept in $RES (~/qwen-results, on the machine, for `plots`)
# and copied to $OUT; the drafts (~100 MB) stay in ~/ for the rest of the lease.
# The package is not pip-installed there (no network): it is assembled under $PKG from the work tree.
# Environment overrides (the CPU dry run in benchmarks/NOTES.md uses them): PYTHON PKG STAGE GGUF15 GGUF05 TARGET
#   SMALL DRAFT ABL RES TRAIN_RECIPE DTYPE BUCKETS PER_BUCKET ABL_BUCKETS ABL_PER_BUCKET NEW DATASETS LONGSPEC_EVAL_DIR, and
#   TRAIN_EXTRA / ABL_EXTRA / EVAL_EXTRA: extra arguments for every `longspec train`, for the ablation runs only,
#   and for eval_lossless.py (e.g. ABL_EXTRA="--max-steps 200 --set-data max_sequences=3200" for a shorter ablation).
set -euo pipefail
: "${OUT:?set OUT to the folder whose files come back}"
PYTHON=${PYTHON:-python3}
PKG=${PKG:-/tmp/pkg}
STAGE=${STAGE:-$HOME/stage}
GGUF15=${GGUF15:-$STAGE/qwen2.5-coder-1.5b-instruct.gguf}
GGUF05=${GGUF05:-$STAGE/qwen2.5-coder-0.5b-instruct.gguf}
TARGET=${TARGET:-$HOME/qwen15}
SMALL=${SMALL:-$HOME/qwen05}
DRAFT=${DRAFT:-$HOME/draft-qwen15}
ABL=${ABL:-$HOME/ablate}
RES=${RES:-$HOME/qwen-results}
TRAIN_RECIPE=${TRAIN_RECIPE:-qwen2.5-coder-1.5b-gpu}
DTYPE=${DTYPE:-bfloat16}
DATASETS=${DATASETS:-code_completion,summarization}
BUCKETS=${BUCKETS:-2048,4096,8192,16384,30000}
PER_BUCKET=${PER_BUCKET:-2}
ABL_BUCKETS=${ABL_BUCKETS:-16384,30000}
ABL_PER_BUCKET=${ABL_PER_BUCKET:-1}
NEW=${NEW:-128}
TRAIN_EXTRA=${TRAIN_EXTRA:-}
ABL_EXTRA=${ABL_EXTRA:-}
EVAL_EXTRA=${EVAL_EXTRA:-}
VARIANTS="full noanchor nonoisy"
export LONGSPEC_EVAL_DIR=${LONGSPEC_EVAL_DIR:-$PWD/.evaldata}
export PYTHONPATH=$PKG:$STAGE/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true HF_HUB_OFFLINE=1

need() {  # need PATH WHAT: stop with a message unless PATH exists
  [ -e "$1" ] || { echo "[gpu_qwen] missing $1: $2" >&2; exit 1; }
}

train_draft() {  # train_draft RECIPE OUTPUT RESULT_NAME [longspec train args...]
  local recipe=$1 output=$2 name=$3
  shift 3
  # shellcheck disable=SC2086  # TRAIN_EXTRA is a list of arguments
  "$PYTHON" -m transformers_longspec.cli train --recipe "$recipe" --target "$TARGET" --output "$output" \
    --save-dtype bf16 --set disable_tqdm=true --set report_to=none "$@" $TRAIN_EXTRA
  cp "$output/longspec_training.json" "$RES/$name.json"
  cp "$RES/$name.json" "$OUT/"
}

evaluate() {  # evaluate DRAFTS BUCKETS PER_BUCKET RESULT_NAME
  # shellcheck disable=SC2086  # EVAL_EXTRA is a list of arguments
  "$PYTHON" benchmarks/eval_lossless.py --target "$TARGET" --draft "$1" --dtype "$DTYPE" --datasets "$DATASETS" \
    --buckets "$2" --per-bucket "$3" --max-new-tokens "$NEW" --out "$RES/$4.json" $EVAL_EXTRA
  cp "$RES/$4.json" "$OUT/"
}

step() {
  case "$1" in
    prepare)
      need "$GGUF15" "stage it with gguf-models (qwen2.5-coder-1.5b-instruct)"
      "$PYTHON" benchmarks/gguf_to_hf.py "$GGUF15" "$TARGET" --dtype bfloat16
      if [ -e "$GGUF05" ]; then
        "$PYTHON" benchmarks/gguf_to_hf.py "$GGUF05" "$SMALL" --dtype bfloat16
      else
        echo "[gpu_qwen] $GGUF05 not staged: no $SMALL (only the assisted-generation baseline needs it)"
      fi ;;
    train)
      need "$TARGET/config.json" "run 'prepare' first"
      train_draft "$TRAIN_RECIPE" "$DRAFT" train_main ;;
    ablate-train)
      need "$TARGET/config.json" "run 'prepare' first"
      local variant switch
      for variant in $VARIANTS; do
        case $variant in
          full) switch="" ;;
          noanchor) switch="--set anchor_offset=false" ;;
          nonoisy) switch="--set noisy_training=false" ;;
        esac
        # shellcheck disable=SC2086  # $switch and $ABL_EXTRA are lists of arguments
        train_draft qwen2.5-coder-1.5b-ablation "$ABL-$variant" "train_ablate_$variant" $switch $ABL_EXTRA
      done ;;
    ablate-tau)
      local drafts="" variant
      for variant in $VARIANTS; do
        need "$ABL-$variant/config.json" "run 'ablate-train' first"
        drafts=${drafts:+$drafts,}$ABL-$variant
      done
      evaluate "$drafts" "$ABL_BUCKETS" "$ABL_PER_BUCKET" tau_ablation ;;
    ablate)
      step ablate-train
      step ablate-tau ;;
    tau)
      need "$DRAFT/config.json" "run 'train' first"
      evaluate "$DRAFT" "$BUCKETS" "$PER_BUCKET" tau_main ;;
    plots)
      "$PYTHON" benchmarks/plot_training.py --results "$RES" --out "$OUT" ;;
    *)
      echo "[gpu_qwen] unknown step '$1' (prepare train ablate ablate-train ablate-tau tau plots)" >&2; exit 2 ;;
  esac
}

main() {
  [ $# -gt 0 ] || { echo "usage: OUT=DIR bash benchmarks/gpu_qwen.sh STEP [STEP...]" >&2; exit 2; }
  case " $* " in
    *" tau "* | *" ablate "* | *" ablate-tau "*)
      need "$LONGSPEC_EVAL_DIR/code_completion.jsonl" "copy ../shared/data/eval/*.jsonl into .evaldata/ and carry it" ;;
  esac
  bash benchmarks/assemble_package.sh "$PKG"
  if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; fi
  local name start
  for name in "$@"; do
    start=$SECONDS
    echo "[gpu_qwen] step $name: start at ${SECONDS} s"
    step "$name"
    echo "[gpu_qwen] step $name: done in $((SECONDS - start)) s (script total ${SECONDS} s)"
  done
}

mkdir -p "$OUT" "$RES"
main "$@" 2>&1 | tee -a "$OUT/gpu_qwen.log"
