#!/usr/bin/env bash
# GPU lease runs of the benchmark harness; Qwen2.5-Coder-1.5B-Instruct target and 0.5B assistant staged at
# ~/stage/*.gguf by gguf-models (README.md in this folder has the commands, run times and what each number means):
#   bash benchmarks/gpu_bench.sh convert   # once per machine: the GGUFs to bf16 HF folders (~2 min; loads in seconds)
#   bash benchmarks/gpu_bench.sh micro     # micro_attention.py: attention paths, verify step vs decode step (~2 min)
#   bash benchmarks/gpu_bench.sh greedy    # longspec bench, every greedy method, exactness vs sdpa (~8 min)
#   bash benchmarks/gpu_bench.sh greedy-math  # the same methods on one math_reasoning problem (set NEW=2048)
#   bash benchmarks/gpu_bench.sh greedy-retrieval  # LongSpec with / without retrieval, retrieval alone, plain baselines
#   bash benchmarks/gpu_bench.sh sample    # longspec bench, sampling at T = 1.0 and 0.7 (~7 min)
# greedy/sample convert first if `convert` has not run on this machine (leaving fewer seconds for prompts).
# Overrides: DRAFT (LongSpec draft folder; none = untrained draft, tau ~ 1), NEW (new tokens, 128), DTYPE (bf16), DATASETS, BUCKETS,
# PER_BUCKET, MAX_S (start no new prompt after this many seconds of benchmarking; default 420 minus the seconds already
# spent, so that a run ends within the 10-minute limit), LONGSPEC_COMMIT (written into the JSON).
# The package is not pip-installed there (no network): it is assembled under $PKG (default /tmp/pkg-bench) from the
# work tree; give concurrent runs distinct PKG folders.
set -euo pipefail
PKG=${PKG:-/tmp/pkg-bench}
bash benchmarks/assemble_package.sh "$PKG"
export PYTHONPATH=$PKG:$HOME/stage/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true LONGSPEC_EVAL_DIR=$PWD/.evaldata
TARGET=$HOME/stage/qwen2.5-coder-1.5b-instruct
ASSISTANT=$HOME/stage/qwen2.5-coder-0.5b-instruct
if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; fi

to_hf() {  # de-quantise a staged GGUF once into a bf16 HF folder beside it (a GGUF-loaded model refuses
  [ -f "$1/config.json" ] && return  # save_pretrained, so its weights go into a plain model of the same config)
  python3 -c "import sys, torch; from transformers import AutoModelForCausalLM; from transformers.utils import logging
from transformers_longspec.cli.models import load_target; logging.disable_progress_bar()
m, t = load_target(sys.argv[1] + '.gguf', torch.bfloat16); m.config.__dict__.pop('quantization_config', None)
d = AutoModelForCausalLM.from_config(m.config, dtype=torch.bfloat16); d.load_state_dict(m.state_dict())
d.save_pretrained(sys.argv[1]); t.save_pretrained(sys.argv[1])" "$1"
}

convert() {
  to_hf "$TARGET"
  if [ -f "$ASSISTANT.gguf" ]; then to_hf "$ASSISTANT"; fi
}

bench() {
  convert
  local budget=$(( SECONDS < 360 ? 420 - SECONDS : 60 ))
  python3 -m transformers_longspec.cli bench --target "$TARGET" ${DRAFT:+--draft "$DRAFT"} \
    $([ -f "$ASSISTANT/config.json" ] && echo --assistant "$ASSISTANT") --dtype "${DTYPE:-bf16}" --max-new-tokens "${NEW:-128}" \
    --per-bucket "${PER_BUCKET:-1}" --max-seconds "${MAX_S:-$budget}" --out "$OUT" "$@" 2>&1 | grep -v "it/s\]$" \
    | tee "$OUT/bench.log"
}

# every greedy method; LongSpec as shipped (static shapes, CUDA graphs, compiled regions) and without compiled regions
# (LongSpec with eager steps: `--variant 'longspec_eager=longspec:{"longspec_static_shapes": false}'`, ~9 tok/s)
GREEDY_METHODS=sdpa,eager,static_compile,plain_graph,assisted,prompt_lookup,longspec,longspec_graphs
VARIANTS=(--variant 'longspec_graphs=longspec:{"longspec_compile": false}')
DEEP='longspec_deep_tree=longspec:{"longspec_beam_widths": [4, 8, 8, 8, 8, 8, 8]}'

# issue 14 / 13: LongSpec as users get it (default tree chosen by the policy, retrieval branch, the draft's own
# vocabulary); the fixed tree [4,16,16,16,16] with retrieval; the same tree without retrieval, with the draft's
# vocabulary and with the whole vocabulary (its τ cost and draft time side by side); the default with the draft's
# 16,384 most frequent tokens only (and the fixed tree so: issue 13's five-level draft time); the fixed tree with a
# first level of 8 (issue 12: the target's token is in the draft's top 4 far more often than its top 1); the fixed tree
# with a 24-token retrieval chain; the 68 best nodes of an eight-level (six-level, five-level) tree of 16 per level with
# retrieval (as many verified tokens as the fixed tree: `longspec_tree_nodes`, tree.best_nodes; five levels: as many
# draft forwards as the fixed tree); retrieval alone; the engine
# verifying the root alone (plain decoding through LongSpec)
RETRIEVAL=(--variant 'longspec_tree=longspec:{"longspec_beam_widths": [4, 16, 16, 16, 16], "longspec_retrieval": 10}'
  --variant 'longspec_noretr=longspec:{"longspec_beam_widths": [4, 16, 16, 16, 16], "longspec_retrieval": 0}'
  --variant 'longspec_noretr_fullvocab=longspec:{"longspec_beam_widths": [4, 16, 16, 16, 16], "longspec_retrieval": 0,
    "longspec_draft_vocab": false}'
  --variant 'longspec_v16k=longspec:{"longspec_draft_vocab": 16384}'
  --variant 'longspec_tree_v16k=longspec:{"longspec_beam_widths": [4, 16, 16, 16, 16], "longspec_retrieval": 10,
    "longspec_draft_vocab": 16384}'
  --variant 'longspec_wide=longspec:{"longspec_beam_widths": [8, 16, 16, 16, 16], "longspec_retrieval": 10}'
  --variant 'longspec_tree24=longspec:{"longspec_beam_widths": [4, 16, 16, 16, 16], "longspec_retrieval": 24}'
  --variant 'longspec_ranked=longspec:{"longspec_beam_widths": [16, 16, 16, 16, 16, 16, 16, 16],
    "longspec_tree_nodes": 68, "longspec_retrieval": 10}'
  --variant 'longspec_ranked6=longspec:{"longspec_beam_widths": [16, 16, 16, 16, 16, 16], "longspec_tree_nodes": 68,
    "longspec_retrieval": 10}'
  --variant 'longspec_ranked5=longspec:{"longspec_beam_widths": [16, 16, 16, 16, 16], "longspec_tree_nodes": 68,
    "longspec_retrieval": 10}'
  --variant 'retrieval_only=longspec:{"longspec_beam_widths": [], "longspec_retrieval": 10}'
  --variant 'engine_plain=longspec:{"longspec_beam_widths": [], "longspec_retrieval": 0}')

case "$1" in
  convert)
    convert ;;
  micro)
    python3 benchmarks/micro_attention.py --out "$OUT" 2>&1 | tee "$OUT/micro.log" ;;
  greedy)
    bench --methods "$GREEDY_METHODS,longspec_deep_tree" "${VARIANTS[@]}" --variant "$DEEP" \
      --datasets "${DATASETS:-code_completion,summarization}" --buckets "${BUCKETS:-8192,16384,30000}" ;;
  greedy-retrieval)
    bench --methods "${METHODS:-sdpa,static_compile,plain_graph,prompt_lookup,longspec,longspec_noretr,retrieval_only,engine_plain}" \
      "${RETRIEVAL[@]}" --datasets "${DATASETS:-code_completion,summarization,heldout}" \
      --buckets "${BUCKETS:-8192,16384,30000}" ;;
  greedy-math)
    bench --methods "$GREEDY_METHODS" "${VARIANTS[@]}" --datasets math_reasoning --buckets 0 ;;
  sample)
    bench --methods sdpa,longspec,sample,longspec_sample --temperatures 1.0,0.7 \
      --datasets "${DATASETS:-code_completion,math_reasoning}" --buckets "${BUCKETS:-8192,30000}" ;;
  *)
    echo "usage: bash benchmarks/gpu_bench.sh convert|micro|greedy|greedy-retrieval|greedy-math|sample" >&2; exit 2 ;;
esac
