#!/usr/bin/env bash
# GPU checks that need no real model. In a lease:
#   bash benchmarks/gpu_check.sh tests      # kernels vs their torch twins, CUDA-graph + compiled-step exactness,
#                                           # attention, 1,000-generation long run
#   bash benchmarks/gpu_check.sh profile [SHAPE] [CONTEXTS]  # step_profile.py on a random-weight target of a real shape
#   bash benchmarks/gpu_check.sh [SHAPE] [CONTEXTS]          # both
# The package is assembled under /tmp/pkg-check (its own folder: other lease scripts may assemble theirs meanwhile).
set -uo pipefail
bash benchmarks/assemble_package.sh /tmp/pkg-check
export PYTHONPATH=/tmp/pkg-check PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
mode=all
case "${1:-}" in tests|profile) mode=$1; shift ;; esac

if [ "$mode" != profile ]; then
  # the whole log is kept (a failure's traceback is what a later session needs); its tail is printed. The kernels'
  # GPU-only tests (real shapes, compiled, graphed) first, then the decode-loop suites, then the kernels' small-shape
  # matrix (CI runs it through the interpreter) if the phase still has time.
  { python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/kernels
    python3 -m pytest -q -s -p no:cacheprovider \
      "tests/test_long_run.py::test_thousand_generations_stay_exact_and_flat[cuda]" \
      tests/test_cuda_graphs.py tests/test_attention.py "tests/test_bench_plain_graph.py" tests/trainers/test_batch_greedy.py
    python3 -m pytest -q -p no:cacheprovider -m "not gpu" tests/kernels; } > "$OUT/gpu_tests.log" 2>&1
  grep -E "passed|failed|error" "$OUT/gpu_tests.log" | tail -6
fi
if [ "$mode" != tests ]; then
  python3 benchmarks/step_profile.py --shape "${1:-qwen2.5-1.5b}" --contexts "${2:-8192,30000}" \
    --out "$OUT/step_profile_${1:-qwen2.5-1.5b}.json" 2>&1 | tail -20 | tee "$OUT/step_profile.log"
fi
