#!/usr/bin/env bash
# Train the Qwen2.5-Coder-1.5B-Instruct draft on the mixed builder's data (issue 12) in one GPU call:
#   OUT=$OUT bash benchmarks/gpu_train_mix.sh            # after `bash benchmarks/gpu_qwen.sh prepare` (~/qwen15)
#   DRY_RUN=1 TARGET=path/to/SmolLM2.gguf OUT=/tmp/o bash benchmarks/gpu_train_mix.sh   # CPU: a few steps, tiny data
#
# Recipe $RECIPE (default qwen2.5-coder-1.5b-mix): code of several languages + prose from the machine's installed
# packages and docs, 16k-token long rows, chat self-distillation (the target answers 256 prompts, <= 75 s), argmax +
# top-16 soft labels; ~2 min of data, ~7 min of training on one H200 (estimate from 0.235 s per 16x1024-token step
# of qwen2.5-coder-1.5b-distill). The draft goes to $DRAFT (bf16); logs and JSON to $OUT:
#   train_mix.log          everything printed (the builder's `longspec data: {...}` line: rows per kind, files
#                          skipped as evaluation material, chat generation seconds)
#   train_mix.json         longspec_training.json (steps, losses, timings_s, log_history)
#   recipe/NAME.json       the recipe as run, under its name (with the chat cache path, MIX_SET, dry-run changes)
# The target's chat answers are cached in $CHAT_CACHE, so a second run in the same lease skips the generation.
# Environment: OUT (required) PYTHON PKG TARGET DRAFT RECIPE CHAT_CACHE TRAIN_EXTRA (extra `longspec train`
#   arguments, e.g. "--max-steps 800 --set soft_labels_weight=0") MIX_SET (JSON merged into data.mix, e.g.
#   '{"long_rows": 0}') DRAFT_SET (JSON merged into the recipe's draft section, e.g. '{"init_from_target": false}')
#   DRY_RUN (1 = CPU smoke run: tiny data, 6 steps, fp32) DRY_STEPS.
set -euo pipefail
: "${OUT:?set OUT to the folder whose files come back}"
PYTHON=${PYTHON:-python3}
PKG=${PKG:-/tmp/pkg-mix}
STAGE=${STAGE:-$HOME/stage}
TARGET=${TARGET:-$HOME/qwen15}
DRAFT=${DRAFT:-$HOME/draft-qwen15-mix}
RECIPE=${RECIPE:-qwen2.5-coder-1.5b-mix}
CHAT_CACHE=${CHAT_CACHE:-$HOME/chat-cache-$(basename "$TARGET").jsonl}
TRAIN_EXTRA=${TRAIN_EXTRA:-}
MIX_SET=${MIX_SET:-}
DRAFT_SET=${DRAFT_SET:-}
DRY_RUN=${DRY_RUN:-0}
DRY_STEPS=${DRY_STEPS:-6}
export PYTHONPATH=$PKG:$STAGE/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true HF_HUB_OFFLINE=1

main() {
  [ -e "$TARGET" ] || { echo "[train_mix] missing $TARGET: run 'bash benchmarks/gpu_qwen.sh prepare'" >&2; exit 1; }
  bash benchmarks/assemble_package.sh "$PKG"
  if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; fi
  # the recipe as run: chat cache, MIX_SET, and in a dry run a tiny mix
  mkdir -p "$OUT/recipe"  # the recipe as run, under its own name (the training record names it)
  RECIPE="$RECIPE" CHAT_CACHE="$CHAT_CACHE" MIX_SET="$MIX_SET" DRAFT_SET="$DRAFT_SET" DRY_RUN="$DRY_RUN" \
    "$PYTHON" - "$OUT/recipe/$(basename "$RECIPE" .json).json" <<'PY'
import json, os, sys
from transformers_longspec.trainers.recipes import RECIPE_DIR
name = os.environ["RECIPE"]
path = name if name.endswith(".json") else str(RECIPE_DIR / f"{name}.json")
recipe = json.load(open(path))
mix = recipe["data"]["mix"]
mix["chat_cache"] = os.environ["CHAT_CACHE"]
if os.environ["DRY_RUN"] == "1":
    mix.update(short_rows=48, short_seq_length=256, short_rows_per_step=4, long_rows=2, long_seq_length=2048,
               long_min_length=1024, chat_prompts=4, chat_prompt_chars=[800, 1600], chat_max_new_tokens=24,
               chat_batch_size=4, chat_time_budget_s=300)
    recipe["training_arguments"].update(eval_steps=3, logging_steps=1, loss_chunk_size=256)
mix.update(json.loads(os.environ["MIX_SET"] or "{}"))
recipe.setdefault("draft", {}).update(json.loads(os.environ["DRAFT_SET"] or "{}"))
if os.environ["DRY_RUN"] == "1" and recipe["draft"].get("draft_vocab_size"):  # tiny data: few distinct tokens
    recipe["draft"]["draft_vocab_size"] = 256
json.dump(recipe, open(sys.argv[1], "w"), indent=2)
print(f"[train_mix] recipe {name} -> {sys.argv[1]}: draft {recipe['draft']}, mix {json.dumps(mix)}")
PY
  local extra=()
  if [ "$DRY_RUN" = 1 ]; then extra=(--max-steps "$DRY_STEPS" --device cpu --dtype fp32 --save-dtype fp32); fi
  local start=$SECONDS
  # shellcheck disable=SC2086  # TRAIN_EXTRA is a list of arguments
  "$PYTHON" -m transformers_longspec.cli train --recipe "$OUT/recipe/$(basename "$RECIPE" .json).json" \
    --target "$TARGET" \
    --output "$DRAFT" --save-dtype bf16 --set disable_tqdm=true --set report_to=none "${extra[@]}" $TRAIN_EXTRA
  cp "$DRAFT/longspec_training.json" "$OUT/train_mix.json"
  echo "[train_mix] done in $((SECONDS - start)) s: draft in $DRAFT, summary in $OUT/train_mix.json"
}

mkdir -p "$OUT"
main "$@" 2>&1 | tee -a "$OUT/train_mix.log"
