#!/usr/bin/env bash
# One single-GPU lease (nvidia-h200) for the Qwen2.5-Coder-1.5B-Instruct target, after staging its GGUF:
#   bash benchmarks/lease_h200.sh launch   # copy the work tree to ~/lease/repo, start the pipeline detached (setsid)
#   bash benchmarks/lease_h200.sh wait SECS  # hold the machine up to SECS (or until DONE), pack ~/lease into
#                                            # $OUT/lease.tgz
# Pipeline (every phase logs to ~/lease/out/<phase>/, a failed phase does not stop the next):
#   convert (GGUF -> bf16 folder ~/qwen15) -> GPU tests (graphs, compiled step, retrieval, long run) beside the
#   training of the draft with the mixed data builder (gpu_train_mix.sh) -> tau matrix (tree / tree + retrieval /
#   chain / retrieval alone on public + held-out documents) -> end-to-end bench of every greedy method.
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
    phase convert 300 bash benchmarks/gpu_qwen.sh prepare
    mkdir -p "$HOME/stage" && ln -sfn "$HOME/qwen15" "$HOME/stage/qwen2.5-coder-1.5b-instruct"
    phase gputests 300 bash benchmarks/gpu_check.sh tests &
    phase train "${TRAIN_S:-420}" env DRAFT="$draft" TRAIN_EXTRA="--max-steps ${STEPS:-1000}" \
      MIX_SET="${MIX_SET:-}" bash benchmarks/gpu_train_mix.sh
    wait
    phase tau $((${TAU_S:-240} + 60)) bash -c "bash benchmarks/assemble_package.sh /tmp/pkg-tau && \
      PYTHONPATH=/tmp/pkg-tau:\$HOME/stage/site LONGSPEC_EVAL_DIR=\$PWD/.evaldata PYTHONUNBUFFERED=1 python3 \
      benchmarks/tau_matrix.py --target \$HOME/qwen15 --draft $draft --datasets \
      code_completion,summarization,heldout:4 --buckets 2048,4096,8192,16384,30000 --per-bucket 2 \
      --max-new-tokens 256 --max-seconds ${TAU_S:-240} --out \$OUT/tau_matrix.json"
    phase bench $((${BENCH_S:-270} + 90)) env DRAFT="$draft" NEW=256 MAX_S="${BENCH_S:-270}" \
      DATASETS="${BENCH_DATASETS:-heldout,code_completion,summarization}" BUCKETS=8192,30000 \
      METHODS=sdpa,plain_graph,prompt_lookup,longspec,longspec_noretr,retrieval_only,engine_plain \
      bash benchmarks/gpu_bench.sh greedy-retrieval
    echo "$(date +%T) DONE" >> "$L/status" ;;
  wait)
    end=$((SECONDS + ${2:-540}))
    while [ $SECONDS -lt "$end" ] && ! grep -q DONE "$L/status" 2>/dev/null; do sleep 5; done
    cat "$L/status"; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
    tar czf "$OUT/lease.tgz" -C "$L" out status pipeline.log && ls -la "$OUT" ;;
  *)
    echo "usage: bash benchmarks/lease_h200.sh launch | wait SECS" >&2; exit 2 ;;
esac
