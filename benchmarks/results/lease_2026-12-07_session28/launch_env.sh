# sourced on the device before `PIPELINE=pipeline-bench lease_h200.sh launch` (session 28: ~650 device-s left after
# four failed starts): session 25's int8 Qwen draft, its tau with both first-level widths (summaries first), then the bench
R=$HOME/lease/repo
export INIT_DRAFT=$R/.init/draft-s25.int8.safetensors PIPELINE=pipeline-bench
export TAU_S=120 TAU_BUCKETS=8192,16384 TAU_CONFIGS=tree+retrieval,tree:8-16-16-16-16+10
export TAU_DATASETS=summarization,heldout:4,code_completion
export BENCH_S=180 BENCH_METHODS=plain_graph,longspec_tree,longspec_wide BENCH_BUCKETS=8192,16384
export BENCH_DATASETS=summarization,code_completion,heldout
