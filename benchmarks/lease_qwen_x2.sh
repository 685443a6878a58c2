#!/usr/bin/env bash
# The whole Qwen2.5-Coder-1.5B-Instruct lease on a 2-GPU machine (nvidia-h200-x2), after staging the GGUF:
#   bash benchmarks/lease_qwen_x2.sh launch [PIPELINE]  # copy the work tree to ~/lease/repo, start PIPELINE detached
#                                               # (training: session 2, the default; speed: session 3, below)
#   bash benchmarks/lease_qwen_x2.sh wait SECS  # hold the machine up to SECS (or until the pipeline ends), then
#                                               # pack everything produced so far into $OUT/lease.tgz
# The pipeline keeps running between calls (setsid), so the calls only need to follow each other within the
# machine's idle limit. Pipeline: convert the GGUF once (~/qwen15) -> in parallel
#   GPU 1: train the draft (gpu_qwen.sh train) -> tau table -> ablations -> loss plots -> 1-GPU distributed run
#   GPU 0: attention micro-benchmarks -> (draft ready) greedy benchmark (all methods) -> sampling benchmark
# -> the 2-GPU distributed run. Every phase logs to ~/lease/out/<phase>/ and a failed phase does not stop the others.
# Pipeline `speed` (issue 4 acceptance, issue 6 GPU long run; the 0.5B assistant staged too): convert both GGUFs ->
#   GPU 1: self-distilled draft (recipe qwen2.5-coder-1.5b-distill) -> math_reasoning with 2,048 new tokens, every
#          method -> tau per bucket -> draft memory 2k..30k
#   GPU 0: GPU tests (CUDA graphs, compiled step, 1,000-generation long run) -> random-weight step profile ->
#          (draft ready) code + summaries 8k/16k/30k with 256 new tokens, every method and the LongSpec variants
set -uo pipefail
L=$HOME/lease

phase() {  # phase NAME GPUS COMMAND...: run COMMAND with OUT=$L/out/NAME on GPUS, log it, record the outcome
  local name=$1 gpus=$2
  shift 2
  mkdir -p "$L/out/$name"
  echo "$(date +%T) start $name" >> "$L/status"
  (cd "$L/repo" && CUDA_VISIBLE_DEVICES=$gpus OUT=$L/out/$name "$@") > "$L/out/$name/phase.log" 2>&1
  echo "$(date +%T) end $name rc=$?" >> "$L/status"
}

case "${1:-}" in
  launch)
    rm -rf "$L" && mkdir -p "$L/out"
    mkdir -p "$L/repo" && tar --exclude=./.stage --exclude=./.git -cf - . | tar -xf - -C "$L/repo"
    setsid nohup bash "$L/repo/benchmarks/lease_qwen_x2.sh" "${2:-training}" > "$L/pipeline.log" 2>&1 < /dev/null &
    sleep 2 && cat "$L/status" 2>/dev/null; echo launched ;;
  training)
    export LONGSPEC_COMMIT=${LONGSPEC_COMMIT:-unknown}  # set it on the launch command line
    phase convert 0 bash benchmarks/gpu_qwen.sh prepare
    mkdir -p "$HOME/stage" && ln -sfn "$HOME/qwen15" "$HOME/stage/qwen2.5-coder-1.5b-instruct"
    (
      phase train 1 bash benchmarks/gpu_qwen.sh train
      touch "$L/draft_ready"
      phase tau 1 env PER_BUCKET=1 bash benchmarks/gpu_qwen.sh tau
      phase ablate 1 bash benchmarks/gpu_qwen.sh ablate plots
      phase multi1 1 bash benchmarks/gpu_multi.sh one
    ) &
    (
      phase micro 0 bash benchmarks/gpu_bench.sh micro
      while [ ! -e "$L/draft_ready" ]; do sleep 5; done
      phase greedy 0 env DRAFT="$HOME/draft-qwen15" DATASETS=code_completion,summarization \
        BUCKETS=8192,16384,30000 MAX_S=330 bash benchmarks/gpu_bench.sh greedy
      phase sample 0 env DRAFT="$HOME/draft-qwen15" BUCKETS=8192,30000 MAX_S=150 bash benchmarks/gpu_bench.sh sample
    ) &
    wait
    phase multi2 0,1 env ONE_JSON="$L/out/multi1/one_gpu.json" bash benchmarks/gpu_multi.sh two
    echo "$(date +%T) DONE" >> "$L/status" ;;
  speed)
    export LONGSPEC_COMMIT=${LONGSPEC_COMMIT:-unknown}
    draft=$HOME/draft-qwen15
    (
      phase convert 1 bash benchmarks/gpu_qwen.sh prepare
      mkdir -p "$HOME/stage" && ln -sfn "$HOME/qwen15" "$HOME/stage/qwen2.5-coder-1.5b-instruct"
      ln -sfn "$HOME/qwen05" "$HOME/stage/qwen2.5-coder-0.5b-instruct"
      phase train 1 env TRAIN_RECIPE=qwen2.5-coder-1.5b-distill bash benchmarks/gpu_qwen.sh train
      touch "$L/draft_ready"
      phase math 1 env DRAFT="$draft" NEW=2048 MAX_S=420 PKG=/tmp/pkg-math bash benchmarks/gpu_bench.sh greedy-math
      phase tau 1 env PER_BUCKET=1 bash benchmarks/gpu_qwen.sh tau
      phase memory 1 bash -c "PYTHONPATH=/tmp/pkg:\$HOME/stage/site LONGSPEC_EVAL_DIR=\$PWD/.evaldata python3 \
        benchmarks/draft_memory.py --target $HOME/qwen15 --draft $draft --out \$OUT/draft_memory.json"
    ) &
    (
      phase gputests 0 bash benchmarks/gpu_check.sh tests
      phase profile 0 bash benchmarks/gpu_check.sh profile
      while [ ! -e "$L/draft_ready" ]; do sleep 5; done
      phase greedy 0 env DRAFT="$draft" NEW=256 MAX_S=480 bash benchmarks/gpu_bench.sh greedy
    ) &
    wait
    echo "$(date +%T) DONE" >> "$L/status" ;;
  wait)
    end=$((SECONDS + ${2:-540}))
    while [ $SECONDS -lt "$end" ] && ! grep -q DONE "$L/status" 2>/dev/null; do sleep 5; done
    cat "$L/status"; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
    tar czf "$OUT/lease.tgz" -C "$L" out status pipeline.log && ls -la "$OUT" ;;
  *)
    echo "usage: bash benchmarks/lease_qwen_x2.sh launch [training|speed] | wait SECS" >&2; exit 2 ;;
esac
