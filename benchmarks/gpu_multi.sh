#!/usr/bin/env bash
# Multi-GPU draft training for Qwen2.5-Coder-1.5B-Instruct on a 2-GPU lease (issue 7), about 5 minutes:
#   bash benchmarks/gpu_multi.sh               # 1 GPU, then 2 GPUs under accelerate + FSDP2; results in $OUT
#   ENGINE=ddp bash benchmarks/gpu_multi.sh     # 2 GPUs as DDP for the draft (target still sharded), if FSDP2 fails
# Each run: stage 1 (40 steps x 16 x 1024 tokens), stage 2 (20 steps x 2 x 16384 tokens, from the saved stage-1
# draft), peak memory per GPU at 16k and 32k tokens, the saved draft reloaded on one GPU and on the CPU.
# $OUT (7 files): one_gpu.{json,log}, two_gpu.{json,log}, summary.{json,md}, loss_curves.png (if matplotlib).
# The package is not pip-installed there (no network): it is assembled under /tmp/pkg-multi from the work tree.
set -uo pipefail
bash benchmarks/assemble_package.sh /tmp/pkg-multi
export PYTHONPATH=/tmp/pkg-multi:$HOME/stage/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
TARGET=${TARGET:-$HOME/qwen15}
[ -d "$TARGET" ] || TARGET=$HOME/stage/qwen2.5-coder-1.5b-instruct.gguf
ENGINE=${ENGINE:-fsdp2}
STEPS=${STEPS:-"--stage1-steps 40 --stage2-steps 20"}
QUIET="Loading weights|Writing model shards|FutureWarning|warnings.warn"
python3 -c "import torch, transformers, accelerate; print('torch', torch.__version__, 'transformers',
  transformers.__version__, 'accelerate', accelerate.__version__, 'gpus', torch.cuda.device_count())"
echo "target $TARGET, engine $ENGINE"

PART=${1:-both}  # one | two | both (a lease may run the 1-GPU part earlier, beside other work; ONE_JSON points to it)
ONE_JSON=${ONE_JSON:-$OUT/one_gpu.json}
if [ "$PART" != two ]; then
# shellcheck disable=SC2086
CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout 270 python3 benchmarks/bench_distributed.py --target "$TARGET" \
  --out "$OUT/one_gpu.json" $STEPS 2>&1 | grep -Ev "$QUIET" > "$OUT/one_gpu.log"
echo "1 GPU: rc ${PIPESTATUS[0]}, $(tail -c 300 "$OUT/one_gpu.log")"
fi
[ "$PART" = one ] && exit 0

if [ "$ENGINE" = ddp ]; then
  LAUNCH=(--multi_gpu --mixed_precision bf16) EXTRA="--target-sharding fsdp"
else
  LAUNCH=(--config_file trainers/distributed/fsdp2.yaml) EXTRA=""
fi
# shellcheck disable=SC2086
timeout 270 python3 -m accelerate.commands.launch "${LAUNCH[@]}" --num_processes 2 \
  benchmarks/bench_distributed.py --target "$TARGET" --out "$OUT/two_gpu.json" $STEPS $EXTRA 2>&1 \
  | grep -Ev "$QUIET" > "$OUT/two_gpu.log"
echo "2 GPUs: rc ${PIPESTATUS[0]}, $(tail -c 300 "$OUT/two_gpu.log")"

if [ -f "$ONE_JSON" ] && [ -f "$OUT/two_gpu.json" ]; then
  python3 benchmarks/plot_distributed.py "$ONE_JSON" "$OUT/two_gpu.json" --summary "$OUT/summary.json" \
    | tee "$OUT/summary.md"
  python3 benchmarks/plot_distributed.py "$ONE_JSON" "$OUT/two_gpu.json" --png "$OUT/loss_curves.png" \
    > /dev/null || echo "no loss_curves.png here (matplotlib missing): run plot_distributed.py --png on the JSONs"
fi
