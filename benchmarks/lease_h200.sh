#!/usr/bin/env bash
# One single-GPU lease (nvidia-h200) for the Qwen2.5-Coder-1.5B-Instruct target (and SmolLM2-135M-Instruct, when
# staged), after staging the GGUFs:
#   bash benchmarks/lease_h200.sh launch   # copy the work tree to ~/lease/repo, start the pipeline detached (setsid)
#   bash benchmarks/lease_h200.sh sync     # copy this call's src/ trainers/ kernels/ benchmarks/ over ~/lease/repo:
#                                          # phases not yet started run the patched code (a fix found mid-lease)
#   bash benchmarks/lease_h200.sh wait SECS  # hold the machine up to SECS (or until DONE), pack ~/lease into
#                                            # $OUT/lease.tgz
# Pipeline (every phase logs to ~/lease/out/<phase>/, a failed phase does not stop the next):
#   convert (GGUFs -> folders ~/qwen15 bf16, ~/smollm2 fp32) -> three side by side: GPU tests (graphs, compiled
#   step, retrieval, long run); the Qwen draft trained on the mixed builder's data (gpu_train_mix.sh, TRAIN_MIN
#   minutes of steps); `smol`: SmolLM2 drafts of the same builder (SMOL_VARIANTS, each SMOL_MIN minutes of steps)
#   and their tau beside the bundled draft (fp32, tree / chain) -> tau matrix of the Qwen draft (tree / tree +
#   retrieval / chain / retrieval alone on public + held-out documents) -> end-to-end bench of every greedy method.
# Set LONGSPEC_COMMIT on the launch command line; carry .evaldata (public jsonl + heldout.jsonl).
set -uo pipefail
L=$HOME/lease

phase() {  # phase NAME SECONDS COMMAND...: run COMMAND (killed after SECONDS) with OUT=$L/out/NAME, log the outcome
  local name=$1 limit=$2
  shift 2
  mkdir -p "$L/out/$name"
  echo "$(date +%T) start $name" >> "$L/status"
  (cd "$L/repo" && OUT=$L/out/$name timeout "$limit" "$@") > "$L/out/$name/phase.log" 2>&1
  echo "$(date +%T) end $name rc=$?" >> "$L/status"
}

case "${1:-}" in
  launch)
    rm -rf "$L" && mkdir -p "$L/out" "$L/repo"
    tar --exclude=./.stage --exclude=./.git -cf - . | tar -xf - -C "$L/repo"
    setsid nohup bash "$L/repo/benchmarks/lease_h200.sh" pipeline > "$L/pipeline.log" 2>&1 < /dev/null &
    sleep 2 && cat "$L/status" 2>/dev/null; echo launched ;;
  pipeline)  # phase limits keep the whole lease inside its device time; override with STEPS / TAU_S / BENCH_S
    export LONGSPEC_COMMIT=${LONGSPEC_COMMIT:-unknown}
    draft=$HOME/draft-qwen15-mix
    phase convert 300 bash -c 'bash benchmarks/gpu_qwen.sh prepare; s=$HOME/stage/smollm2-135m-instruct.gguf; \
      [ ! -f "$s" ] || PYTHONPATH=$HOME/stage/site python3 benchmarks/gguf_to_hf.py "$s" "$HOME/smollm2" --dtype float32'
    mkdir -p "$HOME/stage" && ln -sfn "$HOME/qwen15" "$HOME/stage/qwen2.5-coder-1.5b-instruct"
    phase gputests 300 bash benchmarks/gpu_check.sh tests &
    if [ -f "$HOME/smollm2/config.json" ]; then phase smol "${TRAIN_S:-500}" bash benchmarks/lease_h200.sh smol & fi
    phase train "${TRAIN_S:-500}" env DRAFT="$draft" TRAIN_EXTRA="--max-steps ${STEPS:-900} --max-minutes ${TRAIN_MIN:-4}" \
      MIX_SET="${MIX_SET:-}" bash benchmarks/gpu_train_mix.sh
    wait
    [ -f "$draft/config.json" ] || draft=  # no trained draft (training failed or ran out of time): an untrained one
    [ "${TAU_S:-200}" = 0 ] || phase tau $((${TAU_S:-200} + 60)) bash -c "bash benchmarks/assemble_package.sh /tmp/pkg-tau && \
      PYTHONPATH=/tmp/pkg-tau:\$HOME/stage/site LONGSPEC_EVAL_DIR=\$PWD/.evaldata PYTHONUNBUFFERED=1 python3 \
      benchmarks/tau_matrix.py --target \$HOME/qwen15 ${draft:+--draft $draft} --datasets \
      heldout:4,code_completion,summarization --buckets 8192,16384,30000 --per-bucket 2 \
      --max-new-tokens 256 --max-seconds ${TAU_S:-200} --out \$OUT/tau_matrix.json"
    phase bench $((${BENCH_S:-240} + 90)) env DRAFT="$draft" NEW=256 MAX_S="${BENCH_S:-240}" \
      DATASETS="${BENCH_DATASETS:-heldout,code_completion,summarization}" BUCKETS=8192,30000 \
      METHODS=sdpa,plain_graph,prompt_lookup,longspec,longspec_noretr,retrieval_only,engine_plain \
      bash benchmarks/gpu_bench.sh greedy-retrieval
    echo "$(date +%T) DONE" >> "$L/status" ;;
  smol)  # SmolLM2 drafts from the mixed builder (one after another, sharing the chat cache), each followed by its
         # tau in fp32; the bundled draft's tau first, for the comparison in the same run
    bash benchmarks/assemble_package.sh /tmp/pkg-smol
    smol_tau() {
      PYTHONPATH=/tmp/pkg-smol LONGSPEC_EVAL_DIR=$PWD/.evaldata PYTHONUNBUFFERED=1 python3 benchmarks/tau_matrix.py \
        --target "$HOME/smollm2" --draft "$1" --dtype float32 --datasets heldout:4,code_completion,summarization \
        --buckets 2048,4096 --per-bucket 1 --max-new-tokens 128 --configs tree,chain --max-seconds 60 \
        --out "$OUT/tau_smol_$(basename "$1").json" || true
    }
    smol_tau "$PWD/src/transformers_longspec/drafts/smollm2-135m-instruct"
    for v in ${SMOL_VARIANTS:-mix noinit}; do
      case $v in noinit) set_draft='{"init_from_target": false}' ;; *) set_draft='' ;; esac
      OUT=$OUT/$v DRAFT=$HOME/draft-smol-$v RECIPE=smollm2-mix TARGET=$HOME/smollm2 PKG=/tmp/pkg-smol \
        CHAT_CACHE=$HOME/chat-cache-smollm2.jsonl DRAFT_SET="$set_draft" \
        TRAIN_EXTRA="--max-minutes ${SMOL_MIN:-1.5}" bash benchmarks/gpu_train_mix.sh || continue
      cp -r "$HOME/draft-smol-$v" "$OUT/draft-smol-$v"
      smol_tau "$HOME/draft-smol-$v"
    done ;;
  sync)
    cp -r src trainers kernels benchmarks "$L/repo"/ && echo "synced into $L/repo" ;;
  wait)
    end=$((SECONDS + ${2:-540}))
    while [ $SECONDS -lt "$end" ] && ! grep -q DONE "$L/status" 2>/dev/null; do sleep 5; done
    cat "$L/status"; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
    tar czf "$OUT/lease.tgz" -C "$L" out status pipeline.log && ls -la "$OUT" ;;
  *)
    echo "usage: bash benchmarks/lease_h200.sh launch | sync | wait SECS" >&2; exit 2 ;;
esac
