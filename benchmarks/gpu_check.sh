#!/usr/bin/env bash
# GPU checks that need no real model: CUDA-graph exactness tests + step profile on a random-weight target of a
# real shape. In a lease:  bash benchmarks/gpu_check.sh [SHAPE] [CONTEXTS]
set -uo pipefail
bash benchmarks/assemble_package.sh /tmp/pkg
export PYTHONPATH=/tmp/pkg PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
python3 -m pytest -q -p no:cacheprovider tests/test_cuda_graphs.py tests/test_attention.py 2>&1 | tail -25 | tee "$OUT/gpu_tests.log"
python3 benchmarks/step_profile.py --shape "${1:-qwen2.5-1.5b}" --contexts "${2:-8192,16384,30000}" \
  --out "$OUT/step_profile_${1:-qwen2.5-1.5b}.json" 2>&1 | tail -20 | tee "$OUT/step_profile.log"
